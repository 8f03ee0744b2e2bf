"""The torch model of an encode worker, loaded without importing sentence-transformers where it can be.

A sentence-transformers directory of a BERT encoder (modules.json: Transformer, Pooling, optionally
Normalize; a safetensors checkpoint; absolute positions) is run by `Bert`: the same weights and the same
operations as transformers' BertModel followed by sentence-transformers' Pooling and Normalize, written
with torch alone. Importing sentence-transformers costs 5-10 s (it pulls in transformers' modeling
utilities, torch.distributed.tensor, sympy and scikit-learn); torch alone is what this needs, so a
worker starts in about the time torch takes to import. Any other model goes through
SentenceTransformer, as before. Both are checked against `SentenceTransformer.encode` (tests/test_encode.py).

`embed(ids, lengths, full)` takes int64 ids (rows, width) and per-row lengths; when every row fills the
width (`full`), no attention mask is built (it would be all ones: the same vectors, and on CUDA SDPA's
mask-free kernels).
"""
from __future__ import annotations

import json
from pathlib import Path

_ACTS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
_OTHER_POOLING = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
_ST = "sentence_transformers.models."


def load(path: str, device: str, dtype):
    """`Bert` for a directory it can run, else `StModel` (sentence-transformers)."""
    plan = bert_plan(path)
    return Bert(path, plan, device, dtype) if plan is not None else StModel(path, device, dtype)


def bert_plan(path: str) -> dict | None:
    """What `Bert` needs from a model directory (config, pooling mode, normalize, max_seq_length), or
    None when the directory holds anything else (then sentence-transformers runs it)."""
    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text())
        config = json.loads((root / "config.json").read_text())
        st_config = json.loads((root / "sentence_bert_config.json").read_text())
    except (OSError, ValueError):
        return None
    kinds = [m.get("type", "").removeprefix(_ST).removeprefix("sentence_transformers.sentence_transformer.modules.")
             for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]) or modules[0].get("path"):
        return None
    if (config.get("model_type") != "bert" or config.get("position_embedding_type", "absolute") != "absolute"
            or config.get("is_decoder") or config.get("hidden_act") not in _ACTS or st_config.get("model_args")
            or not isinstance(st_config.get("max_seq_length"), int) or not (root / "model.safetensors").is_file()):
        return None
    try:
        pooling = json.loads((root / modules[1]["path"] / "config.json").read_text())
    except (OSError, ValueError):
        return None
    modes = pooling.get("pooling_mode")
    if modes is None:
        if any(pooling.get(k) for k in _OTHER_POOLING):
            return None
        modes = [mode for key, mode in _POOLING_KEYS.items() if pooling.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in _POOLING_KEYS.values():
        return None
    return {"config": config, "pooling": modes[0], "normalize": kinds[2:] == ["Normalize"],
            "max_seq_length": st_config["max_seq_length"]}


class Bert:
    """A BERT encoder with sentence-transformers' pooling, in torch alone (module docstring)."""

    def __init__(self, path: str, plan: dict, device: str, dtype):
        import torch
        from safetensors.torch import load_file

        self.torch, self.F = torch, torch.nn.functional
        c = plan["config"]
        self.heads, self.eps, self.approximate = c["num_attention_heads"], c["layer_norm_eps"], _ACTS[c["hidden_act"]]
        self.pooling, self.normalize, self.max_seq_length = plan["pooling"], plan["normalize"], plan["max_seq_length"]
        self.dim = c["hidden_size"]
        raw = load_file(str(Path(path) / "model.safetensors"))
        w = {k.removeprefix("bert."): v.to(device=device, dtype=dtype) for k, v in raw.items()}
        e = "embeddings."
        self.word, self.position = w[e + "word_embeddings.weight"], w[e + "position_embeddings.weight"]
        types = w.get(e + "token_type_embeddings.weight")
        self.type0 = types[0] if types is not None else None       # every token's type is 0, as the pool sends
        self.embed_norm = (w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"])
        self.layers = []
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            qkv_w = torch.cat([w[a + f"self.{n}.weight"] for n in ("query", "key", "value")])
            qkv_b = torch.cat([w[a + f"self.{n}.bias"] for n in ("query", "key", "value")])
            self.layers.append((qkv_w, qkv_b, w[a + "output.dense.weight"], w[a + "output.dense.bias"],
                                w[a + "output.LayerNorm.weight"], w[a + "output.LayerNorm.bias"],
                                w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"],
                                w[p + "output.dense.weight"], w[p + "output.dense.bias"],
                                w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]))
        self.forward = self._forward

    def compile(self) -> None:
        self.forward = self.torch.compile(self._forward, dynamic=None)

    def embed(self, ids, lengths, full: bool):
        """Sentence embeddings (rows, dim), in the model's dtype. full: every row's length is the width
        (told by the caller, who knows it on the host), so no mask is built."""
        mask = None if full else self.torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
        return self.forward(ids, mask)

    def _forward(self, ids, mask):
        F = self.F
        rows, width = ids.shape
        x = F.embedding(ids, self.word) + self.position[:width]
        if self.type0 is not None:
            x = x + self.type0
        x = F.layer_norm(x, (self.dim,), *self.embed_norm, self.eps)
        attend = None if mask is None else mask[:, None, None, :]
        head = self.dim // self.heads
        for qkv_w, qkv_b, ow, ob, n1w, n1b, iw, ib, o2w, o2b, n2w, n2b in self.layers:
            q, k, v = F.linear(x, qkv_w, qkv_b).view(rows, width, 3, self.heads, head).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend).transpose(1, 2).reshape(rows, width, self.dim)
            x = F.layer_norm(F.linear(a, ow, ob) + x, (self.dim,), n1w, n1b, self.eps)
            h = F.gelu(F.linear(x, iw, ib), approximate=self.approximate)
            x = F.layer_norm(F.linear(h, o2w, o2b) + x, (self.dim,), n2w, n2b, self.eps)
        out = self._pool(x, mask)
        return F.normalize(out, p=2, dim=1) if self.normalize else out

    def _pool(self, x, mask):
        torch = self.torch
        if self.pooling == "cls":
            return x[:, 0]                          # the pool's rows start at their first token: no left padding
        if self.pooling == "max":
            return x.max(dim=1).values if mask is None else x.masked_fill(~mask[:, :, None], float("-inf")).max(1).values
        acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        if mask is None:
            total = x.sum(dim=1, dtype=acc)
            count = torch.full((x.shape[0], 1), float(x.shape[1]), dtype=acc, device=x.device)
        else:
            m = mask[:, :, None].to(x.dtype)
            total, count = (x * m).sum(dim=1, dtype=acc), m.sum(dim=1, dtype=acc).clamp(min=1e-9)
        out = total / (count if self.pooling == "mean" else count.sqrt())
        return out.to(x.dtype)


class StModel:
    """Any other model: SentenceTransformer's modules on the features, like its encode minus tokenization."""

    def __init__(self, path: str, device: str, dtype):
        from sentence_transformers import SentenceTransformer

        try:                                    # no "Loading weights" progress bar from every worker
            from transformers.utils import logging

            logging.disable_progress_bar()
        except ImportError:
            pass
        model = SentenceTransformer(path, device=device)
        self.torch = __import__("torch")
        self.model = model.to(dtype).eval()
        names = getattr(getattr(model[0], "tokenizer", None), "model_input_names", None)
        self.wants_token_types = names is None or "token_type_ids" in names
        dim_of = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim, self.max_seq_length = int(dim_of()), int(model.max_seq_length)

    def compile(self) -> None:
        # sentence-transformers calls the transformer's forward by name: compile that
        transformer = self.model[0].auto_model
        transformer.forward = self.torch.compile(transformer.forward, dynamic=None)

    def embed(self, ids, lengths, full: bool):
        torch = self.torch
        mask = (torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]).long()
        features = {"input_ids": ids, "attention_mask": mask}
        if self.wants_token_types:
            features["token_type_ids"] = torch.zeros_like(ids)
        return self.model(features)["sentence_embedding"]
