"""``tg run train-char``: a small character-level transformer trained with ``tg.Trainer``.

The text is ``pydoc_data.topics`` (the standard library's help topics, about 465k characters),
so nothing is downloaded. The model is ``tg.nn.GPT2``'s architecture at a small width with the
character set as vocabulary, trained with AdamW on random windows of the text; the last tenth
is held out to report a validation loss, and text is sampled from the trained weights with a
second, inference-only program over the same weight names.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from tensor_graphs.compiler import compile as compile_graph
from tensor_graphs.ir import api as tg
from tensor_graphs.nn import GPT2, GPT2Config
from tensor_graphs.nn.sampling import Sampling
from tensor_graphs.optim import AdamW
from tensor_graphs.train import Trainer


def text() -> str:
    """The standard library's pydoc topics, joined in a fixed order."""
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics))


@dataclass(frozen=True)
class Corpus:
    """The text as ids over its sorted character set, split 90/10 into train and validation."""

    chars: str
    train: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, source: str) -> Corpus:
        chars = "".join(sorted(set(source)))
        lookup = {c: i for i, c in enumerate(chars)}
        ids = np.fromiter((lookup[c] for c in source), np.int64, len(source))
        cut = len(ids) * 9 // 10
        return cls(chars, ids[:cut], ids[cut:])

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, rng: np.random.Generator, batch: int, seq: int,
              split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """``batch`` random windows: inputs (batch, seq) and next characters (batch * seq,)."""
        data = self.train if split == "train" else self.valid
        starts = rng.integers(0, len(data) - seq - 1, batch)
        windows = data[starts[:, None] + np.arange(seq + 1)]
        return windows[:, :seq], windows[:, 1:].reshape(-1)


@dataclass(frozen=True)
class Options:
    """The job's sizes (the command line's options)."""

    steps: int = 600
    batch: int = 32
    seq: int = 64
    width: int = 128
    layers: int = 2
    heads: int = 4
    lr: float = 3e-3
    warmup: int = 50
    seed: int = 0
    sample: int = 300
    # None: the process's count, as the other jobs take it (TG_NUM_THREADS, OMP_NUM_THREADS,
    # torch.set_num_threads, else the cores: tensor_graphs.threads). Two threads are faster
    # now that the backward's products, sums and casts are C kernels on the C team, which
    # shrinks under contention (load ~8: 143 ms a step against 246 on one thread); before, the
    # plan's numpy and torch kernels stalled on two (load 6: 0.9 to 4.5 s a step against 75 ms)
    threads: int | None = None


def model(corpus: Corpus, o: Options) -> GPT2:
    return GPT2(GPT2Config(vocab_size=len(corpus.chars), n_positions=o.seq, n_embd=o.width,
                           n_layer=o.layers, n_head=o.heads))


def initial_weights(trainer: Trainer, layers: int, seed: int) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: normal(0, 0.02) matrices and embeddings, the residual
    projections scaled by 1/sqrt(2 * layers), norms at one, biases at zero."""
    rng = np.random.default_rng(seed)
    values = {}
    for name, leaf in trainer.params.items():
        shape = tuple(int(d) for d in leaf.shape)
        if name.endswith(".bias"):
            values[name] = np.zeros(shape, np.float32)
        elif ".ln_" in name:
            values[name] = np.ones(shape, np.float32)
        else:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
            values[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return values


def build(corpus: Corpus, o: Options, **compile_options) -> tuple[Trainer, Callable]:
    """The trainer of next-character cross entropy, and a validation loss function (its own
    program over the same weight names, fed the trainer's current weights)."""
    net = model(corpus, o)
    ids = tg.input("ids", (o.batch, o.seq), "int64")
    targets = tg.input("targets", (o.batch * o.seq,), "int64")
    logits = tg.reshape(net(ids), (o.batch * o.seq, len(corpus.chars)))
    loss = tg.cross_entropy(logits, targets)
    trainer = Trainer(loss, optimizer=AdamW(o.lr, betas=(0.9, 0.99), weight_decay=0.01),
                      **compile_options)
    trainer.bind(**initial_weights(trainer, o.layers, o.seed))
    evaluate = compile_graph(loss, **compile_options)

    def validation(batches: int = 4, seed: int = 1) -> float:
        evaluate.bind(**trainer.weights())
        rng = np.random.default_rng(seed)
        return float(np.mean([float(evaluate(ids=x, targets=y)) for x, y in
                              (corpus.batch(rng, o.batch, o.seq, "valid")
                               for _ in range(batches))]))

    return trainer, validation


def schedule(step: int, o: Options) -> float:
    """Linear warm-up, then cosine decay to a tenth of the rate."""
    if step < o.warmup:
        return o.lr * (step + 1) / o.warmup
    done = (step - o.warmup) / max(1, o.steps - o.warmup)
    return o.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0))))


def train(trainer: Trainer, corpus: Corpus, o: Options) -> Iterator[tuple[int, float, float]]:
    """(step, loss, seconds of the step) for each step, the schedule applied."""
    rng = np.random.default_rng(o.seed + 1)
    for step in range(o.steps):
        trainer.set_lr(schedule(step, o))
        x, y = corpus.batch(rng, o.batch, o.seq)
        start = time.perf_counter()
        loss = trainer.step(ids=x, targets=y)
        yield step, loss, time.perf_counter() - start


def sampler(trainer: Trainer, corpus: Corpus, o: Options, **compile_options):
    """A function ``(prompt, n, temperature, seed) -> text`` over the trained weights: an
    inference program of the last position's logits for one window of ``seq`` characters."""
    net = model(corpus, o)
    ids = tg.input("ids", (1, o.seq), "int64")
    prog = compile_graph(net(ids, last_only=True), **compile_options)
    prog.bind(**trainer.weights())

    def sample(prompt: np.ndarray, n: int, temperature: float = 0.8, seed: int = 0) -> str:
        rng = np.random.default_rng(seed)
        draw = Sampling.checked(temperature=temperature)
        window = list(prompt[-o.seq:])
        out = []
        for _ in range(n):
            logits = np.asarray(prog(ids=np.array([window[-o.seq:]], np.int64))).reshape(1, -1)
            nxt = int(draw.choose(logits, rng)[0])
            window.append(nxt)
            out.append(nxt)
        return corpus.decode(out)

    return sample


def trained_weights(o: Options, **compile_options) -> tuple[Corpus, dict[str, np.ndarray]]:
    """The corpus and the weights after ``o.steps`` steps (``run`` without its report), for
    measuring the trained model elsewhere (``tg quality train-char``)."""
    corpus = Corpus.of(text())
    trainer, _ = build(corpus, o, **compile_options)
    for _ in train(trainer, corpus, o):
        pass
    return corpus, trainer.weights()


WEIGHTS_METADATA = ("width", "layers", "heads", "seq", "steps", "seed")  # Options kept in a file


def save_weights(path, weights: dict[str, np.ndarray], corpus: Corpus, o: Options) -> None:
    """A safetensors file of the trained weights, with the character set and the sizes in its
    metadata: the file alone rebuilds the model (``load_weights``)."""
    import json

    from tensor_graphs.runtime.weights import write_safetensors

    meta = {"chars": json.dumps(corpus.chars), **{k: str(getattr(o, k))
                                                  for k in WEIGHTS_METADATA}}
    write_safetensors(path, {k: np.asarray(v, np.float32) for k, v in weights.items()}, meta)


def load_weights(path) -> tuple[Corpus, Options, dict[str, np.ndarray]]:
    """The corpus (over the file's character set), the sizes and the weights of a file
    ``save_weights`` wrote."""
    import json

    from tensor_graphs.errors import ArgumentError
    from tensor_graphs.ir.dtypes import as_dtype
    from tensor_graphs.runtime.weights import (
        SAFETENSORS_DTYPES,
        read_safetensors,
        read_safetensors_header,
    )

    # the project's reader: a file that is no safetensors is a SerializationError naming it
    header = read_safetensors_header(path)
    meta = header.metadata or {}
    missing = [k for k in ("chars", *WEIGHTS_METADATA) if k not in meta]
    if missing:
        raise ArgumentError(f"{path}: not a train-char weights file (its metadata lacks "
                            f"{missing}); write one with tg quality train-char --save FILE")
    weights = read_safetensors(path, {n: (t.shape, as_dtype(SAFETENSORS_DTYPES[t.dtype]))
                                      for n, t in header.tensors.items()})
    chars = json.loads(meta["chars"])
    o = Options(**{k: int(meta[k]) for k in WEIGHTS_METADATA})
    lookup = {c: i for i, c in enumerate(chars)}
    source = "".join(c for c in text() if c in lookup)
    ids = np.fromiter((lookup[c] for c in source), np.int64, len(source))
    cut = len(ids) * 9 // 10
    return Corpus(chars, ids[:cut], ids[cut:]), o, weights


def progress_line(step: int, steps: int, loss: float, tokens_per_s: float, elapsed: float,
                  width: int = 24) -> str:
    filled = int(width * (step + 1) / steps)
    return (f"\r[{'#' * filled}{'-' * (width - filled)}] step {step + 1}/{steps} "
            f"loss {loss:.3f} {tokens_per_s / 1e3:.1f}k tokens/s {elapsed:.0f}s")


def run(o: Options, db=None, profile: str = "never", stream=None, out=None) -> int:
    """The job: build, train with a progress bar (on ``stream``, stderr), report the loss
    curve, validation loss and time, and sample text (on ``out``, stdout). Returns 0 when the
    loss fell."""
    stream, out = stream or sys.stderr, out or sys.stdout
    from tensor_graphs import threads

    count = o.threads or threads.get_num_threads()
    threads.set_num_threads(count)
    corpus = Corpus.of(text())
    tokens = o.batch * o.seq
    print(f"text: pydoc_data.topics, {len(corpus.train) + len(corpus.valid):,} characters, "
          f"{len(corpus.chars)} distinct (train {len(corpus.train):,}, validation "
          f"{len(corpus.valid):,})", file=out)
    options = {"db": db, "profile": profile}
    start = time.perf_counter()
    trainer, validation = build(corpus, o, **options)
    n_params = sum(int(np.prod(p.shape)) for p in trainer.params.values())
    setup = time.perf_counter() - start
    memory = trainer.memory()["cpu"]
    print(f"model: {o.layers} layers, width {o.width}, {o.heads} heads, window {o.seq}: "
          f"{n_params:,} parameters; batch {o.batch} x {o.seq} = {tokens} tokens per step; "
          f"AdamW lr {o.lr:g} (warm-up {o.warmup}, cosine); {count} thread"
          f"{'s' if count != 1 else ''}", file=out)
    print(f"planned the training step in {setup:.1f} s: {len(trainer.program.plan.steps)} "
          f"steps (forward, backward, update), {memory / 2**20:.1f} MiB", file=out, flush=True)
    tty = getattr(stream, "isatty", lambda: False)()
    every = max(1, o.steps // 10)
    curve, recent, first = [], [], None
    began = time.perf_counter()
    step_seconds = 0.0
    for step, loss, seconds in train(trainer, corpus, o):
        first = loss if first is None else first
        recent = (recent + [loss])[-every:]
        step_seconds += seconds
        rate = tokens * (step + 1) / step_seconds
        if tty:
            stream.write(progress_line(step, o.steps, float(np.mean(recent)), rate,
                                       time.perf_counter() - began))
            stream.flush()
        if (step + 1) % every == 0 or step + 1 == o.steps:
            mean = float(np.mean(recent))
            curve.append((step + 1, mean))
            if not tty:
                stream.write(progress_line(step, o.steps, mean, rate,
                                           time.perf_counter() - began)[1:] + "\n")
                stream.flush()
    if tty:
        stream.write("\n")
    elapsed = time.perf_counter() - began
    final = curve[-1][1]
    print("loss curve (mean training loss, nats/char): "
          + ", ".join(f"{s}: {v:.3f}" for s, v in curve), file=out)
    print(f"validation loss: {validation():.3f} nats/char; first step {first:.3f}", file=out)
    print(f"trained {o.steps} steps in {elapsed:.1f} s ({step_seconds / o.steps * 1e3:.0f} ms "
          f"a step, {tokens * o.steps / step_seconds / 1e3:.1f}k tokens/s); loop: "
          f"{trainer.program.loop}", file=out)
    sample = sampler(trainer, corpus, o, **options)
    prompt = corpus.valid[:o.seq]
    print(f"sample ({o.sample} characters after a validation window):", file=out)
    print(corpus.decode(prompt) + "|" + sample(prompt, o.sample), file=out, flush=True)
    return 0 if final < first else 1
