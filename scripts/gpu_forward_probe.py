"""Where the GPU's forward pass stands, outside any pool: MiniLM fp16 on ~183-token rows, the
transformer alone (sdpa, eager) and through sentence-transformers, at a few batch sizes.
    python scripts/gpu_forward_probe.py MODEL_DIR [cuda:0] [rows]     # prints one JSON line"""
import json
import sys
import time

import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel

path, dev = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cuda:0")
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
cuda = dev.startswith("cuda")
dtype = torch.float16 if cuda else torch.float32
sync = torch.cuda.synchronize if cuda else (lambda: None)
sizes = (256, 512, 1024) if cuda else (8,)
out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if cuda else "cpu", "rows": rows}


def rate(fn, batch: int) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1000, 29000, (batch, 184), generator=g).to(dev)
    x[:, 0], x[:, -1] = 101, 102
    mask, types = torch.ones_like(x), torch.zeros_like(x)
    with torch.inference_mode():
        for _ in range(3 if cuda else 1):
            fn(x, mask, types)
        sync()
        n, started = 0, time.perf_counter()
        while n < rows:
            fn(x, mask, types)
            n += batch
        sync()
    return round(n / (time.perf_counter() - started), 1)


for attn in ("sdpa", "eager"):
    m = AutoModel.from_pretrained(path, attn_implementation=attn, dtype=dtype).to(dev).eval()
    for b in sizes:
        out[f"hf_{attn}_{b}"] = rate(lambda x, a, t: m(input_ids=x, attention_mask=a, token_type_ids=t), b)
st = SentenceTransformer(path, device=dev).to(dtype).eval()
for b in sizes:
    out[f"st_{b}"] = rate(lambda x, a, t: st({"input_ids": x, "attention_mask": a, "token_type_ids": t}), b)
torch.set_num_threads(2)
out["st_2threads"] = rate(lambda x, a, t: st({"input_ids": x, "attention_mask": a, "token_type_ids": t}), sizes[-1])
print(json.dumps(out))
