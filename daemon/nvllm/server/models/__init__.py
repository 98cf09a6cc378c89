"""The models a daemon serves: which (served_models.py), their slots and leases (model_set.py), how each is
loaded and unloaded (model_loader.py), and how long one stays loaded (keep_alive.py)."""
