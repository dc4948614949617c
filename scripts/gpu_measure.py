"""The measurements of scripts/gpu_check.py: bf16 peaks, model FLOPs, and training / decoding speed of
tcli's own models on synthetic batches. Every function takes a `device`, so each runs on the CPU with
a tiny model in a test (tests/scripts/test_gpu_check.py) before a GPU is ever lent.

A timed training step is the trainer's own: `Trainer.update` (`Trainer.train_step`: autocast from
`Runtime.context()`, the task's `step_loss`, backward, clipping, the optimizer and its schedule) on a
`TranslationTask` or `BertTask` given a synthetic batch instead of a corpus, with the model of a count-params
preset (`transformer_cli.tools.count_params`, `transformer_cli.models.builders`). Parameters are counted on
the built model and model FLOPs come from `transformer_cli.models.params`, the count-params formulas.
"""

from __future__ import annotations

import gc
import math
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from transformer_cli.bert.task import BertTask
from transformer_cli.data.bert import BertBatch
from transformer_cli.data.translation import Batch
from transformer_cli.models.params import bert_train_flops, count_model, shorthand_train_flops, translation_train_flops
from transformer_cli.train.loop import Trainer
from transformer_cli.translation.task import TranslationTask
from transformer_cli.vocab.spm import BOS_ID, EOS_ID

# bf16 dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s. A name matches the
# first entry whose key it contains, so the more specific names come first.
BF16_DENSE_TFLOPS: list[tuple[str, float]] = [
    ("GH200", 989.0),
    ("H200 NVL", 835.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
]

FLOPS_FORMULA = {
    "summary": (
        "training FLOPs per step = 6 x (parameters a token passes through in matmuls) x tokens "
        "+ 12 x layers x d_model x attended length per token (PaLM appendix B / Megatron-LM: "
        "forward 2 FLOPs per multiply-add, backward twice the forward; attention QK^T and AV, "
        "causal masks not halved); computed by transformer_cli.models.params (translation_train_flops, "
        "bert_train_flops) from count-params' per-layer counts"
    ),
    "translation": (
        "6 x ((N_enc + N_kv) x source tokens + (N_dec - N_kv + V x d) x target tokens) + 12 x d x "
        "(L_enc x S x source tokens + L_dec x (T + S) x target tokens); N_enc, N_dec = parameters of "
        "the encoder and decoder layers, N_kv = the decoder's cross-attention key/value projections "
        "(applied once to the encoder output), V x d = output projection (tied to the embeddings, "
        "applied to every target token); with equal source and target tokens this is exactly "
        "6 x count-params total x tokens + attention"
    ),
    "bert": (
        "6 x (L x layer parameters x tokens + MLM head (H^2 + 3H + V x H + V) x masked positions + "
        "(pooler + NSP) x sequences) + 12 x L x H x T x tokens; embedding tables are lookups (no matmul) "
        "and tcli computes the tied MLM decoder only at the masked positions"
    ),
    "simple_6ND": (
        "also reported: 6 x count-params total x tokens + attention, the common shorthand, which for "
        "BERT charges the vocabulary projection at every position and so overstates the work"
    ),
    "mfu": "model FLOPs per step / step time / bf16 dense peak of the device",
}


# ----------------------------------------------------------------------------- peaks and FLOPs


def table_peak_tflops(device_name: str) -> float | None:
    """The datasheet bf16 dense peak of a GPU by its torch device name, or None if it is not in the table."""
    for key, tflops in BF16_DENSE_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def matmul_tflops(
    device: str | torch.device, n: int = 8192, reps: int = 10, dtype: torch.dtype = torch.bfloat16
) -> float:
    """Achieved TFLOP/s of an n x n x n matmul (the median of `reps`, after warm-up)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def mfu(flops_per_step: float, step_seconds: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak (None without a peak)."""
    if not peak_tflops or step_seconds <= 0:
        return None
    return flops_per_step / step_seconds / (peak_tflops * 1e12)


# ----------------------------------------------------------------------------- measurements


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _memory(device: torch.device) -> dict[str, float | None]:
    if device.type != "cuda":
        return {"peak_memory_allocated_gib": None, "peak_memory_reserved_gib": None}
    return {
        "peak_memory_allocated_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        "peak_memory_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2),
    }


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _timed_steps(
    step: Callable[[], Any], warmup: int, steps: int, device: torch.device, deadline: float | None
) -> tuple[float, int, list[Any]]:
    """Run `warmup` untimed steps, then up to `steps` timed ones (fewer once time.perf_counter() passes
    `deadline`: a short measurement is worth more than a section killed at its limit).

    Returns the seconds of the timed steps, how many ran, and what the first and the last step returned.
    """

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    outputs = [step()]
    for _ in range(warmup - 1):
        if late():
            break
        step()
    _sync(device)
    t0, done = time.perf_counter(), 0
    last = None
    while done < steps:
        last = step()
        done += 1
        if late():
            break
    _sync(device)
    seconds = time.perf_counter() - t0
    if last is not None:
        outputs.append(last)
    return seconds, done, outputs


class _Synthetic:
    """A task's own `step_loss` on batches the caller makes: no corpus, vocabulary or validation data.

    One batch an epoch: the schedule's length is train.max_steps (1 in a count-params preset), so the learning
    rate follows the first updates of the preset's warmup, as a real run's first steps do.
    """

    def __init__(self, cfg: Any, model: torch.nn.Module):
        self.cfg, self.model = cfg, model

    def epoch_batches(self, epoch: int) -> list[None]:
        return [None]


class SyntheticTranslation(_Synthetic, TranslationTask):
    """`TranslationTask.step_loss` (label-smoothed loss per target token) on synthetic batches."""


class SyntheticBert(_Synthetic, BertTask):
    """`BertTask.step_loss` (MLM per masked position + NSP per sequence) on synthetic batches."""


def _measurement_trainer(task: SyntheticTranslation | SyntheticBert, cfg: Any, runtime: Any) -> Trainer:
    """tcli's Trainer for `task`, without a run directory: it takes `update()`s and writes nothing."""
    return Trainer(task, cfg.train, None, runtime, quiet=True)


def _timed_updates(
    trainer: Trainer, batch: Any, warmup: int, steps: int, device: torch.device, deadline: float | None
) -> tuple[float, int, list[float]]:
    """`_timed_steps` of `trainer.update([batch])`: seconds, steps timed, the loss (as the train events report
    it) of the first and the last update."""
    seconds, done, outputs = _timed_steps(lambda: trainer.update([batch]), warmup, steps, device, deadline)
    losses = [trainer.task.summarize({k: float(v) for k, v in out.items()})["loss"] for out in outputs]
    return seconds, done, losses


def _fit_batch(
    run: Callable[[int], dict[str, Any]], batch: int, device: torch.device, min_batch: int = 1
) -> dict[str, Any]:
    """run(batch); on out-of-memory, free what the attempt held and retry at half the batch."""
    tried = []
    while True:
        tried.append(batch)
        try:
            result = run(batch)
            result["batches_tried"] = tried
            return result
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            if not _is_oom(e) or batch // 2 < min_batch:
                raise
        # Out of the except block the exception, and the frames holding the attempt's tensors, are gone.
        _free(device)
        batch //= 2


def _train_setup(preset: str, overrides: list[str], vocab: int, device: torch.device, precision: str):
    """The run config of a count-params preset (with --set style overrides) and tcli's Runtime."""
    from transformer_cli.runtime.device import Runtime
    from transformer_cli.tools.count_params import preset_config

    cfg = preset_config(preset, [f"vocab.size={vocab}", *overrides])
    runtime = Runtime.create(str(device), precision)
    return cfg, runtime


def _optional(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """An extra measurement that must not fail its section: its error is recorded in its place."""
    try:
        return measure()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def profile_steps(step: Callable[[], Any], device: torch.device, steps: int = 3, top: int = 15) -> dict[str, Any]:
    """torch.profiler over a few training steps: the operators with the most self time (GPU time on CUDA),
    per step, and the profiler's table, whose footer gives the total CPU and GPU self time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    wall = time.perf_counter() - t0
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    rows = [
        {"name": e.key, "calls_per_step": e.count / steps, "self_ms_per_step": round(getattr(e, key) / 1000 / steps, 3)}
        for e in events
    ]
    return {
        "steps": steps,
        "sorted_by": key,
        "wall_ms_per_step_profiled": round(1000 * wall / steps, 2),
        "top": rows,
        "table": prof.key_averages().table(sort_by=key, row_limit=top),
    }


def measure_loss(
    device: str | torch.device, rows: int, vocab: int, label_smoothing: float = 0.1, reps: int = 10
) -> dict[str, Any]:
    """Forward + backward of the label-smoothed loss on (rows, vocab) bf16 logits: tcli's fused loss as the
    models run it (its softmax goes a CPU-cache-sized chunk of rows at a time, one kernel sequence per
    chunk), the same as one chunk, and torch's F.cross_entropy. On a GPU the chunk loop may cost more in
    kernel launches than it saves; this says whether it does."""
    import torch.nn.functional as F

    from transformer_cli.models import losses

    device = torch.device(device)
    logits = torch.randn(rows, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (rows,), device=device)

    def tcli_loss() -> None:
        logits.grad = None  # a fresh gradient each time, as in training (no accumulation pass)
        losses.smoothed_cross_entropy(logits, target, label_smoothing).loss.backward()

    def torch_loss() -> None:
        logits.grad = None
        F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing, reduction="sum").backward()

    def ms(fn: Callable[[], None]) -> float:
        for _ in range(2):
            fn()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        return round(1000 * (time.perf_counter() - t0) / reps, 3)

    result: dict[str, Any] = {"rows": rows, "vocab": vocab, "tcli_chunked_ms": ms(tcli_loss)}
    chunk = getattr(losses, "_CHUNK_ELEMENTS", None)
    if chunk is not None:
        result["chunk_rows"] = max(1, chunk // vocab)
        losses._CHUNK_ELEMENTS = rows * vocab
        try:
            result["tcli_one_chunk_ms"] = ms(tcli_loss)
        finally:
            losses._CHUNK_ELEMENTS = chunk
    result["torch_cross_entropy_fp32_ms"] = ms(torch_loss)
    return result


def measure_translation(
    device: str | torch.device = "cuda",
    preset: str = "transformer-base",
    vocab: int = 32000,
    batch: int = 256,
    src_len: int = 48,
    tgt_len: int = 48,
    warmup: int = 5,
    steps: int = 20,
    overrides: list[str] | None = None,
    precision: str = "bf16",
    peak_tflops: float | None = None,
    budget_s: float | None = None,
    seed: int = 0,
    loss_check: bool = False,
) -> dict[str, Any]:
    """Training throughput of tcli's Transformer on synthetic batches of batch x src_len -> tgt_len tokens.

    `budget_s` (from this call on, model building included) cuts the timed steps short rather than overrun.
    """
    from transformer_cli.models.builders import build_transformer

    deadline = None if budget_s is None else time.perf_counter() + budget_s
    device = torch.device(device)
    cfg, runtime = _train_setup(preset, overrides or [], vocab, device, precision)
    torch.manual_seed(seed)
    trainer = _measurement_trainer(SyntheticTranslation(cfg, build_transformer(cfg.model, vocab, vocab)), cfg, runtime)
    params = count_model(trainer.model, "translation")["total"]
    m = cfg.model

    def run(rows: int) -> dict[str, Any]:
        trainer.optimizer.zero_grad(set_to_none=True)  # after an out-of-memory attempt
        synthetic = _translation_batch(rows, src_len, tgt_len, vocab, torch.Generator().manual_seed(seed)).to(device)
        n_src, n_tgt = synthetic.src_tokens, synthetic.tokens
        _reset_memory(device)
        seconds, done, losses = _timed_updates(trainer, synthetic, warmup, steps, device, deadline)
        flops = translation_train_flops(m, vocab, n_src, n_tgt, src_len, tgt_len)
        simple = shorthand_train_flops(params, n_tgt, m.enc_layers + m.dec_layers, m.d_model, src_len)
        per_step = seconds / max(done, 1)
        return {
            "batch_sentences": rows,
            "src_tokens_per_step": n_src,
            "tgt_tokens_per_step": n_tgt,
            "steps_timed": done,
            "steps_requested": steps,
            "step_ms": round(1000 * per_step, 2),
            "tgt_tokens_per_s": round(n_tgt / per_step, 1),
            "src_plus_tgt_tokens_per_s": round((n_tgt + n_src) / per_step, 1),
            "sequences_per_s": round(rows / per_step, 1),
            **_memory(device),
            "model_flops_per_step": flops,
            "model_tflops_per_s": round(flops["total"] / per_step / 1e12, 2),
            "mfu": _round(mfu(flops["total"], per_step, peak_tflops)),
            "simple_6ND_flops_per_step": simple,
            "mfu_simple_6ND": _round(mfu(simple, per_step, peak_tflops)),
            "loss_first_last": [round(x, 4) for x in losses],
            "loss_finite": all(map(math.isfinite, losses)),
        }

    result = _fit_batch(run, batch, device)
    if loss_check:
        rows = result["tgt_tokens_per_step"]
        result["loss_fwd_bwd"] = _optional(lambda: measure_loss(device, rows, vocab, cfg.train.label_smoothing))
    sizes = {k: getattr(m, k) for k in ("d_model", "heads", "ffn_dim", "enc_layers", "dec_layers", "norm")}
    return {
        "model": f"{preset} ({sizes}), vocabulary {vocab}, shared embeddings and tied output",
        "parameters": params,
        "precision": runtime.precision,
        "device": str(device),
        "warmup_steps": warmup,
        **result,
    }


def _translation_batch(rows: int, src_len: int, tgt_len: int, vocab: int, generator: torch.Generator) -> Batch:
    """Random source sentences of src_len tokens (EOS last) and targets of tgt_len, no padding."""
    src = torch.randint(EOS_ID + 1, vocab, (rows, src_len), generator=generator)
    src[:, -1] = EOS_ID
    tgt = torch.randint(EOS_ID + 1, vocab, (rows, tgt_len + 1), generator=generator)
    tgt[:, 0] = BOS_ID
    tgt_in, labels = tgt[:, :-1], tgt[:, 1:]  # (B, T) each: the decoder's input, the next token at each position
    return Batch(src, tgt_in, labels, tokens=labels.numel(), src_tokens=src.numel())


def _bert_batch(rows: int, seq_len: int, masked: int, vocab: int, generator: torch.Generator) -> BertBatch:
    """[CLS] A [SEP] B [SEP] of random tokens, `masked` positions per row chosen among the non-special ones."""
    from transformer_cli.models.losses import IGNORE

    cls_id, sep_id, mask_id, first = 2, 3, 4, 5  # tcli's BERT vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK]
    ids = torch.randint(first, vocab, (rows, seq_len), generator=generator)
    half = seq_len // 2
    ids[:, 0], ids[:, half], ids[:, -1] = cls_id, sep_id, sep_id
    segments = torch.zeros_like(ids)
    segments[:, half + 1 :] = 1
    keys = torch.rand(rows, seq_len, generator=generator)
    keys[:, [0, half, seq_len - 1]] = 2.0  # never chosen
    positions = keys.topk(masked, dim=1, largest=False).indices  # (rows, masked)
    labels = torch.full_like(ids, IGNORE)
    labels.scatter_(1, positions, ids.gather(1, positions))
    ids.scatter_(1, positions, mask_id)
    nsp = torch.randint(0, 2, (rows,), generator=generator)
    return BertBatch(ids, segments, labels, nsp, masked=rows * masked, real_tokens=ids.numel())


def measure_bert_data(
    batch: int, seq_len: int, vocab: int, masked: int, batches: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Host time of tcli's BERT data path for one batch: `make_batch` (collate the NSP pairs, draw the MLM
    masks) over `make_instances` of synthetic documents. The trainer makes each batch in the training
    process between steps, so this is time the GPU step has to hide or wait for."""
    import random

    from transformer_cli.data.bert import SpecialIds, make_batch, make_instances

    rng = random.Random(seed)
    docs = [
        [[rng.randrange(5, vocab) for _ in range(rng.randint(8, 40))] for _ in range(rng.randint(3, 30))]
        for _ in range(max(50, batch * batches // 4))
    ]
    t0 = time.perf_counter()
    instances = make_instances(docs, seq_len, 0.1, random.Random(seed + 1))
    per_instance = (time.perf_counter() - t0) / max(len(instances), 1)
    ids = SpecialIds(pad=0, cls=2, sep=3, mask=4, first_normal=5, vocab_size=vocab)
    generator = torch.Generator().manual_seed(seed)
    n = max(1, min(batches, len(instances) // batch))
    t0 = time.perf_counter()
    for i in range(n):
        make_batch(instances[i * batch : (i + 1) * batch], ids, 0.15, masked, generator)
    per_batch = (time.perf_counter() - t0) / n
    return {
        "batch_sequences": batch,
        "make_batch_ms": round(1000 * per_batch, 2),
        "make_instances_ms_per_batch": round(1000 * per_instance * batch, 2),
        "host_sequences_per_s": round(batch / per_batch, 1),
        "torch_threads": torch.get_num_threads(),
    }


def measure_bert(
    device: str | torch.device = "cuda",
    preset: str = "bert-base",
    vocab: int = 30522,
    batch: int = 256,
    seq_len: int = 128,
    masked: int = 20,
    warmup: int = 5,
    steps: int = 20,
    overrides: list[str] | None = None,
    precision: str = "bf16",
    peak_tflops: float | None = None,
    budget_s: float | None = None,
    seed: int = 0,
    profile: bool = False,
    data_check: bool = False,
) -> dict[str, Any]:
    """Pretraining throughput (MLM + NSP) of tcli's BERT on synthetic batches of batch x seq_len tokens.

    `budget_s` (from this call on, model building included) cuts the timed steps short rather than overrun.
    """
    from transformer_cli.models.builders import build_bert

    deadline = None if budget_s is None else time.perf_counter() + budget_s
    device = torch.device(device)
    cfg, runtime = _train_setup(preset, [f"data.max_seq_len={seq_len}", *(overrides or [])], vocab, device, precision)
    torch.manual_seed(seed)
    trainer = _measurement_trainer(SyntheticBert(cfg, build_bert(cfg.model, vocab)), cfg, runtime)
    params = count_model(trainer.model, "bert")["total"]
    m = cfg.model

    def run(rows: int) -> dict[str, Any]:
        trainer.optimizer.zero_grad(set_to_none=True)  # after an out-of-memory attempt
        synthetic = _bert_batch(rows, seq_len, masked, vocab, torch.Generator().manual_seed(seed)).to(device)
        tokens, n_masked = synthetic.input_ids.numel(), synthetic.masked
        _reset_memory(device)
        seconds, done, losses = _timed_updates(trainer, synthetic, warmup, steps, device, deadline)
        flops = bert_train_flops(m, vocab, tokens, seq_len, n_masked, rows)
        simple = shorthand_train_flops(params, tokens, m.layers, m.d_model, seq_len)
        per_step = seconds / max(done, 1)
        result = {
            "batch_sequences": rows,
            "tokens_per_step": tokens,
            "masked_per_sequence": masked,
            "steps_timed": done,
            "steps_requested": steps,
            "step_ms": round(1000 * per_step, 2),
            "tokens_per_s": round(tokens / per_step, 1),
            "sequences_per_s": round(rows / per_step, 1),
            **_memory(device),
            "model_flops_per_step": flops,
            "model_tflops_per_s": round(flops["total"] / per_step / 1e12, 2),
            "mfu": _round(mfu(flops["total"], per_step, peak_tflops)),
            "simple_6ND_flops_per_step": simple,
            "mfu_simple_6ND": _round(mfu(simple, per_step, peak_tflops)),
            "loss_first_last": [round(x, 4) for x in losses],
            "loss_finite": all(map(math.isfinite, losses)),
        }
        if profile:  # after the timing and the memory reading, which it would disturb
            result["profile"] = _optional(lambda: profile_steps(lambda: trainer.update([synthetic]), device))
        return result

    result = _fit_batch(run, batch, device)
    if data_check:
        rows = result["batch_sequences"]
        result["host_data"] = _optional(lambda: measure_bert_data(rows, seq_len, vocab, masked))
    sizes = {k: getattr(m, k) for k in ("d_model", "layers", "heads", "ffn_dim")}
    return {
        "model": f"{preset} ({sizes}), vocabulary {vocab}, MLM + NSP heads",
        "parameters": params,
        "precision": runtime.precision,
        "device": str(device),
        "seq_len": seq_len,
        "warmup_steps": warmup,
        **result,
    }


def measure_decode(
    device: str | torch.device = "cuda",
    preset: str = "transformer-base",
    vocab: int = 32000,
    batch: int = 256,
    src_len: int = 32,
    out_len: int = 32,
    beam: int = 5,
    reps: int = 3,
    overrides: list[str] | None = None,
    precision: str = "bf16",
    budget_s: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Beam-search speed of tcli's decoder at a fixed output length.

    Random weights give no sensible output, and a hypothesis ending early would change the work. The
    EOS row of the (tied) embedding matrix is zeroed, so EOS's logit is 0 while the best of ~32k random
    logits are far above it: no hypothesis ends before the length limit max_len_a=0, max_len_b=out_len,
    where beam search forces EOS. Every sentence then decodes exactly out_len tokens (EOS included);
    `all_full_length` checks it. The model is cast to the autocast dtype, as `tcli translate` does.
    """
    from transformer_cli.models.builders import build_transformer
    from transformer_cli.translation.decode import beam_search

    device = torch.device(device)
    start = time.perf_counter()  # budget_s counts from here, model building included
    cfg, runtime = _train_setup(preset, overrides or [], vocab, device, precision)
    torch.manual_seed(seed)
    model = build_transformer(cfg.model, vocab, vocab)
    with torch.no_grad():
        model.tgt_embed.weight[EOS_ID].zero_()
    model = model.to(device, runtime.autocast_dtype or torch.float32).eval()
    src = torch.randint(EOS_ID + 1, vocab, (batch, src_len), generator=torch.Generator().manual_seed(seed))
    src[:, -1] = EOS_ID
    src = src.to(device)

    def decode():
        with runtime.context():
            return beam_search(model, src, BOS_ID, EOS_ID, beam=beam, lenpen=1.0, max_len_a=0.0, max_len_b=out_len)

    decode()  # warm-up
    _sync(device)
    _reset_memory(device)
    t0, done, tokens, full = time.perf_counter(), 0, 0, True
    while done < reps:
        hyps = decode()
        done += 1
        lengths = [len(h[0].tokens) + 1 if h else 0 for h in hyps]  # generated pieces with EOS, as tcli translate
        tokens += sum(lengths)
        full = full and all(n == out_len for n in lengths)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    _sync(device)
    seconds = time.perf_counter() - t0
    return {
        "model": f"{preset}, vocabulary {vocab}, random weights, EOS embedding zeroed",
        "precision": runtime.precision,
        "device": str(device),
        "beam": beam,
        "batch_sentences": batch,
        "src_len": src_len,
        "out_len": out_len,
        "reps_timed": done,
        "reps_requested": reps,
        "all_full_length": full,
        "decoded_tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "sentences_per_s": round(batch * done / seconds, 1),
        **_memory(device),
        "counted": "tokens of the best hypothesis of each sentence, EOS included (as tcli translate's stats)",
    }


def resolve_peak(device: str | torch.device, matmul_n: int = 8192) -> tuple[float, str]:
    """The bf16 peak MFU is taken against, and where it comes from: the datasheet table, else a matmul."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        table = table_peak_tflops(name)
        if table:
            return table, f"datasheet bf16 dense ({name}; table in scripts/gpu_measure.py)"
    return _round(matmul_tflops(device, n=matmul_n)), f"measured {matmul_n}^3 bf16 matmul"


def measure_device(device: str | torch.device = "cuda", matmul_n: int = 8192) -> dict[str, Any]:
    """The GPU, its datasheet bf16 peak (if known) and a measured bf16 matmul; which peak MFU uses."""
    device = torch.device(device)
    measured = _round(matmul_tflops(device, n=matmul_n))
    if device.type != "cuda":
        return {
            "name": platform.processor() or "CPU",
            "measured_bf16_matmul_tflops": measured,
            "peak_tflops": measured,
            "peak_source": f"measured {matmul_n}^3 bf16 matmul",
        }
    props = torch.cuda.get_device_properties(device)
    table = table_peak_tflops(props.name)
    if table:
        peak, source = table, "datasheet bf16 dense (table in scripts/gpu_measure.py)"
    else:
        peak, source = measured, f"measured {matmul_n}^3 bf16 matmul (the device is not in the table)"
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "bf16_supported": torch.cuda.is_bf16_supported(),
        "table_bf16_dense_tflops": table,
        "measured_bf16_matmul_tflops": measured,
        "peak_tflops": peak,
        "peak_source": source,
    }


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")
