"""What a sliding-window model's long sequences hold of the page pool, with the pages behind the windows
given back (cache.hybrid_kv_cache, the default) and kept (false), in one run.

Serves `--seqs` random prompts of `--prompt-len` tokens, each generating `--gen-len`, together, on one
pool of `--pool-mb`; after every step reads the pages in use. Prints per mode: the layout (groups, layers
per page, bytes per page), the most pool bytes in use at once, that per sequence, preemptions, and the
wall time. The greedy tokens of both modes are compared (chunked alike, they are equal).

    python tools/window_pages.py --model gemma-3-270m-Q4_K_M.gguf     # from `nvllm models synthesize`
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from nvllm import LLM, SamplingParams


def run(model: str, hybrid: bool, prompts: list[list[int]], gen_len: int, pool_mb: int, chunk: int) -> dict:
    probe = LLM(model, num_blocks=64, max_model_len=64, hybrid_kv_cache=hybrid).engine.kv_cache
    page_bytes = probe.nbytes // probe.num_blocks
    blocks = (pool_mb << 20) // page_bytes
    llm = LLM(model, num_blocks=blocks, max_num_seqs=len(prompts), max_num_batched_tokens=chunk,
              max_model_len=max(map(len, prompts)) + gen_len, enable_prefix_caching=False, hybrid_kv_cache=hybrid)
    engine, bm = llm.engine, llm.engine.block_manager
    if engine.backing is not None:   # the pages the sequences hold, not how fast a busy machine backs the pool:
        engine.backing.wait()        # pages not yet backed would preempt a sequence here
    params = SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    seqs = [engine.seqs[str(i)] for i in range(len(prompts))]
    peak, t0 = 0, time.monotonic()
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, bm.num_used_blocks)
    layout = engine.kv_cache.layout
    return {"hybrid_kv_cache": hybrid, "groups": layout.num_groups, "layers_per_page": layout.slots,
            "page_bytes": page_bytes, "pool_pages": blocks, "peak_bytes": peak * page_bytes,
            "peak_bytes_per_seq": peak * page_bytes // len(prompts), "preemptions": llm.stats()["preemptions"],
            "seconds": round(time.monotonic() - t0, 2),
            "tokens": [s.token_ids[len(p):] for s, p in zip(seqs, prompts)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--pool-mb", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=512, help="scheduler.max_num_batched_tokens")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 256, args.prompt_len).tolist() for _ in range(args.seqs)]   # in any vocabulary
    both = [run(args.model, h, prompts, args.gen_len, args.pool_mb, args.chunk) for h in (True, False)]
    same = both[0].pop("tokens") == both[1].pop("tokens")
    for r in both:
        print(json.dumps(r))
    print(json.dumps({"peak_bytes_ratio_kept_to_given_back": round(both[1]["peak_bytes"] / both[0]["peak_bytes"], 2),
                      "same_tokens": same}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
