"""The shapes of the encode pool's batches: the batch plan a device gets, how a window's rows are cut
into padded batches, and the bounded set of (rows, width) shapes a bounded plan can make.

NOTE (bounded shapes): on CUDA, SDPA with a mask builds a cuDNN plan for every new (rows, width) shape
(46-99 ms each on an H200), and torch.compile a graph, so a run that keeps meeting new shapes keeps
paying. A bounded plan (batch_shapes "bounded"; "auto": on CUDA or compiled) rounds each batch's
width up to a multiple of SHAPE_WIDTH (the model's max length is the last width), takes a fixed row
count per width (batch_size rows within max_tokens padded tokens), and pads a window's last batch of
a width with copies of its last row up to a multiple of a ROW_STEPS-th of that row count: at most
ROW_STEPS row counts per width, `plan_shapes` lists them all (32 for MiniLM's 256 tokens), and a
worker can run each once at start (warm_up). The copied rows' vectors are dropped. Only a batch split
after a failure (_batches.Batch.halves) makes another shape. An exact plan (the CPU's default, where
a shape costs nothing and padding is only cost) pads each batch to its longest row.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._messages import BatchPlan, TokenBatch

# Batch defaults when the caller leaves them to the device. CPU: up to 64 rows and 3,072 padded
# tokens, so ~183-token chunks go 16 at a time (bare encode here: 16 beat 32 by 10% on them) and
# short texts in bigger batches. CUDA: up to 512 rows and 65,536 tokens (~5 ms of H100 work at
# ~183 tokens, well above eager BERT's launch overhead).
CPU_BATCH, CPU_TOKENS, GPU_BATCH, GPU_TOKENS = 64, 3072, 512, 65536
PAD_MULTIPLE = 8                      # exact plans on CUDA, or compiled: lengths padded to a multiple of this
SHAPE_WIDTH = 32                      # bounded plans: widths are multiples of this
ROW_STEPS = 4                         # bounded plans: row counts per width
SHAPES = ("auto", "bounded", "exact")


def make_plan(device: str, max_length: int, batch_size: int | None, max_batch_tokens: int | None,
              compiled: bool, shapes: str = "auto") -> BatchPlan:
    """The batch plan for workers on `device` (the first worker's), from the caller's settings."""
    on_gpu = device.startswith("cuda")
    rows = batch_size or (GPU_BATCH if on_gpu else CPU_BATCH)
    budget = (GPU_TOKENS if on_gpu else CPU_TOKENS) if batch_size is None else rows * max_length
    tokens = max_batch_tokens or budget                  # a batch_size given alone is taken as it is
    bounded = shapes == "bounded" or (shapes == "auto" and (on_gpu or compiled))
    multiple = SHAPE_WIDTH if bounded else PAD_MULTIPLE if on_gpu or compiled else 1
    return BatchPlan(rows, tokens, max_length, multiple, bounded)


def _rows_for(plan: BatchPlan, width: int) -> int:
    return max(1, min(plan.batch_size, plan.max_tokens // max(width, 1)))


def _width_for(plan: BatchPlan, longest: int) -> int:
    width = -(-longest // plan.multiple) * plan.multiple
    if width > plan.max_length:
        width = plan.max_length if plan.bounded else longest
    return width


def plan_shapes(plan: BatchPlan) -> tuple[tuple[int, int], ...]:
    """Every (rows, width) a bounded plan makes (NOTE), widest first; () for an exact plan."""
    if not plan.bounded:
        return ()
    widths = sorted({*range(plan.multiple, plan.max_length + 1, plan.multiple), plan.max_length}, reverse=True)
    shapes = []
    for width in widths:
        full = _rows_for(plan, width)
        step = -(-full // ROW_STEPS)
        shapes += [(rows, width) for rows in sorted({min(full, k * step) for k in range(1, ROW_STEPS + 1)},
                                                    reverse=True)]
    return tuple(shapes)


def bucket_by_length(flat: np.ndarray, lengths: np.ndarray, pad_id: int, plan: BatchPlan) -> tuple[TokenBatch, ...]:
    """Sort rows longest first (stable) and cut them into batches: each padded to its longest row
    rounded up to a multiple of plan.multiple (within the model's max length), with at most
    plan.batch_size rows and plan.max_tokens padded tokens; a bounded plan's batches in its shapes
    (NOTE). `flat` holds the rows' ids one after another. A batch's ids are one gather of whole rows from
    a sliding-window view of `flat` (row r is flat[start_r:start_r + width]), then the padding past each
    row's length: no per-token index arrays (the encode pool's coordinator pays this for every chunk of a
    run: 1.5 -> 0.5 us a chunk)."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable").astype(np.int32)
    sizes = lengths[order].tolist()
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    widest = max(_width_for(plan, sizes[0]) if sizes else 0, 1)
    windows = sliding_window_view(np.concatenate([np.asarray(flat, dtype=np.int32),
                                                  np.full(widest, pad_id, dtype=np.int32)]), widest)
    batches, i = [], 0
    while i < len(order):
        width = _width_for(plan, sizes[i])
        full = _rows_for(plan, width)
        rows = order[i:i + full]
        padded_rows = rows
        if plan.bounded and len(rows) < full:            # copies of the last row, up to the next row count
            step = -(-full // ROW_STEPS)
            padded_rows = np.concatenate([rows, np.repeat(rows[-1:], min(full, -(-len(rows) // step) * step)
                                                          - len(rows))])
        row_lengths = lengths[padded_rows]
        padded = windows[starts[padded_rows], :width]    # a row longer than the model's length is cut
        if len(row_lengths) and int(row_lengths.min()) < width:
            padded = np.where(np.arange(width) < row_lengths[:, None], padded, np.int32(pad_id))
        batches.append(TokenBatch(positions=rows, ids=padded, lengths=row_lengths))
        i += len(rows)
    return tuple(batches)
