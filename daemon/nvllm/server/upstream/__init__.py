"""Upstreams: bigger OpenAI-compatible servers behind the board ([[upstreams]]). A front door that is about to
refuse a request for a reason its upstream's policy names asks the Forwarder (forwarder.py) to have it
answered there; upstream_policy.py says which upstream, upstream_client.py speaks HTTP to it. An upstream that
fails gives back None, and the front door refuses as it would have without one."""
