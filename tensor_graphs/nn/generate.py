"""Generation with a KV cache: ``tg.generate(causal_lm, input_ids, max_new_tokens)``.

A transformers causal LM is rebuilt from its config with ``tg.nn``'s layers (the table
``ARCHITECTURES``, by ``config.model_type``) and its state dict bound by name. Two programs are
compiled once per :class:`Generator`, over the same cache layout (one ``tg.state`` per layer
for keys and one for values):

- *prefill*: the whole prompt (symbolic length up to ``max_prompt``) into an empty cache,
  logits of the last position only;
- *decode*: one token per step (static shape), attending over the cached prefix of symbolic
  length ``past`` up to ``max_len - 1``; planned once at that bound, so a step never plans,
  compiles or allocates, and runs the same instruction list at any cache length.

After prefill its cache is bound into the decode program once (one copy of the prompt's keys
and values); every decode step then appends in place. A left-padded batch (prompts of
different lengths) runs a second such pair, compiled on its first call, whose input ``pad``
gives each row's padding: per-row positions and a mask that hides the padding.

Everything is checked before any work: token ids against the vocabulary, the prompt and
``max_new_tokens`` against the cache, the padding, the options, and the generation settings
(the model's ``generation_config`` under the call's). The tokens are those of transformers'
``generate(do_sample=False)``: ``repetition_penalty`` is applied as transformers applies it,
and a setting under which transformers would choose other tokens that is not applied here
(beam search, n-gram bans, forced tokens...) is refused, never ignored. ``do_sample=True``
draws each token as transformers' ``generate(do_sample=True)`` does (``nn/sampling.py``:
temperature, top-k, top-p, min-p, the model's generation_config under the call's), from
numpy's generator (``seed``); the model's own ``do_sample`` is not followed, so a call
decodes greedily unless it asks to sample.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from tensor_graphs.devices import as_device
from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError, StateError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.nn.attention import KVCache
from tensor_graphs.nn.models import GPT2, GPT2Config, Llama, LlamaConfig
from tensor_graphs.nn.sampling import SETTINGS as SAMPLING
from tensor_graphs.nn.sampling import Sampling
from tensor_graphs.runtime.values import HostReader, on_host

# transformers model_type -> (reads its config, builds our model): what tg.generate accepts
ARCHITECTURES: dict[str, tuple[Callable, type]] = {
    "gpt2": (GPT2Config.from_hf, GPT2),
    "llama": (LlamaConfig.from_hf, Llama),
    "mistral": (LlamaConfig.from_hf, Llama),
    "qwen2": (LlamaConfig.from_hf, Llama),
    "qwen3": (LlamaConfig.from_hf, Llama),
}


def _given(value, settings) -> bool:
    return value is not None and not (isinstance(value, list | tuple | dict) and not value)


def _other_than(inactive):
    return lambda value, settings: value is not None and value != inactive


def _above_zero(value, settings) -> bool:
    return value is not None and value > 0


def _holds_back_eos(value, settings) -> bool:  # transformers applies it only with an eos
    return _above_zero(value, settings) and settings.get("eos_token_id") is not None


def _contrastive(value, settings) -> bool:  # transformers' top_k defaults to 50
    top_k = settings.get("top_k")
    return _above_zero(value, settings) and (top_k is None or top_k > 1)


def _sampling_only(active: Callable[[object, Mapping], bool]):
    """A warper transformers applies only when it samples (and not applied here)."""
    return lambda value, settings: settings.get("do_sample") is True and active(value, settings)


def _below_one(value, settings) -> bool:
    return value is not None and value < 1.0


def _cutoff(value, settings) -> bool:
    return value is not None and 0.0 < value < 1.0


# Generation settings under which transformers' generate chooses other tokens than it would
# without them, none of them applied here: each with when it is active (at any other value
# transformers applies nothing) and what it does. The sampling settings applied here
# (``SAMPLING``) are not listed, nor the model's do_sample (a default the call replaces:
# do_sample=True in the call samples); the warpers not applied are, active when sampling.
_REFUSED: dict[str, tuple[Callable[[object, Mapping], bool], str]] = {
    "num_beams": (_other_than(1), "beam search"),
    "num_return_sequences": (_other_than(1), "several sequences per prompt"),
    "constraints": (_given, "constrained beam search"),
    "force_words_ids": (_given, "constrained beam search"),
    "penalty_alpha": (_contrastive, "contrastive search"),
    "dola_layers": (_given, "DoLa decoding"),
    "guidance_scale": (_other_than(1), "classifier-free guidance"),
    "sequence_bias": (_given, "biases the scores of token sequences"),
    "encoder_repetition_penalty": (_other_than(1), "rewards the prompt's tokens"),
    "no_repeat_ngram_size": (_above_zero, "bans repeated n-grams"),
    "encoder_no_repeat_ngram_size": (_above_zero, "bans the prompt's n-grams"),
    "bad_words_ids": (_given, "bans token sequences"),
    "min_length": (_holds_back_eos, "holds eos back up to a length"),
    "min_new_tokens": (_holds_back_eos, "holds eos back for a number of new tokens"),
    "forced_bos_token_id": (_given, "forces the first new token"),
    "forced_eos_token_id": (_given, "forces eos at max_length"),
    "exponential_decay_length_penalty": (_given, "raises eos's score with the length"),
    "suppress_tokens": (_given, "bans tokens"),
    "begin_suppress_tokens": (_given, "bans tokens at the first step"),
    "remove_invalid_values": (lambda value, settings: value is True,
                              "replaces nan and inf scores"),
    "watermarking_config": (_given, "watermarks the scores"),
    "token_healing": (lambda value, settings: bool(value), "rewrites the prompt's last token"),
    "stop_strings": (_given, "stops at strings"),
    "max_time": (_given, "stops after a time limit"),
    "typical_p": (_sampling_only(_below_one), "typical sampling"),
    "epsilon_cutoff": (_sampling_only(_cutoff), "epsilon sampling"),
    "eta_cutoff": (_sampling_only(_cutoff), "eta sampling"),
    "top_h": (_sampling_only(_given), "top-H sampling"),
}
# the generation settings applied here (eos and pad tokens, the repetition penalty, sampling)
_APPLIED = ("eos_token_id", "pad_token_id", "repetition_penalty", "do_sample", *SAMPLING)
# transformers' settings taken and left alone: they change no token (a cache is always kept)
_INERT = ("use_cache",)
# every generation setting a call may give
_SETTINGS = (*_APPLIED, *_REFUSED, *_INERT)
# Generator's own options that from_transformers / tg.generate pass through
_BUILD_OPTIONS = ("quantize", "group_size", "skip", "prequantized", "padded", "seed")


# tg.compile's options a Generator does not take (``compiler.compile_options`` less these):
# ``bounds`` (each program's are set here), ``plan`` (a lock file is one program's; a
# Generator compiles two) and ``outputs`` (results stay on the device the programs run on)
_SET_HERE = ("bounds", "plan", "outputs")


def _compile_keywords() -> tuple[str, ...]:
    """tg.compile's options a Generator takes and passes on (imported late, as compile is)."""
    from tensor_graphs.compiler import compile_options

    return compile_options(*_SET_HERE)


# options of transformers' generate that tg.generate does not take, and what to do instead
_INSTEAD = {
    "max_length": "tg.generate counts new tokens: give max_new_tokens (max_length less the "
                  "prompt's length)",
    "streamer": "Generator.stream(prompt, max_new_tokens) yields each step's tokens as they come",
}


def _unknown(where: str, unknown: Sequence[str], groups: Mapping[str, Sequence[str]]) -> None:
    """Refuse options nothing here takes, naming those accepted; one that transformers'
    generate takes says what to do instead (``_INSTEAD``), not only that it is unknown."""
    if unknown:
        accepted = "; ".join(f"{what}: {', '.join(names)}" for what, names in groups.items())
        instead = "".join(f"\n  {name}: {_INSTEAD[name]}" for name in sorted(unknown)
                          if name in _INSTEAD)
        raise ArgumentError(f"{where}: unknown option(s) {', '.join(sorted(unknown))}; "
                            f"accepted: {accepted}{instead}")


def _generation_settings(generation_config, call: Mapping[str, object],
                         fix: str = "set causal_lm.generation_config.{name} = None") -> dict:
    """The settings transformers' generate would use (the model's generation_config, the
    call's on top), refusing every one that would change the tokens and is not applied here.
    ``fix``: what a refusal of one of the model's settings says to do (``{name}``: its name)."""
    names = _SETTINGS
    settings = {n: getattr(generation_config, n, None) for n in names}
    settings["do_sample"] = None
    settings.update(call)
    if settings["do_sample"] not in (None, True, False):
        raise ArgumentError(f"generate: do_sample must be True or False, got "
                            f"{settings['do_sample']!r}")
    mode = "do_sample=True" if settings["do_sample"] is True else "do_sample=False"
    for name, (active, what) in _REFUSED.items():
        value = settings[name]
        if active(value, settings):
            if name in call:
                where, todo = "this call", f"leave {name} out"
            else:
                where, todo = "the model's generation_config", fix.format(name=name)
            raise ArgumentError(f"generate: {where} sets {name}={value!r} ({what}); tg.generate "
                                "does not apply it, and its tokens would differ from "
                                f"transformers' generate({mode}): {todo} to generate "
                                "without it")
    unused = [n for n in SAMPLING if n in call and call[n] is not None]
    if unused and settings["do_sample"] is not True:
        raise ArgumentError(f"generate: {', '.join(unused)} are sampling settings, and this "
                            "call decodes greedily: pass do_sample=True to sample with them, "
                            "or leave them out")
    return settings


def _sampling_options(settings: Mapping) -> dict:
    """What a Generator takes of ``settings`` to sample: the warpers' values (the model's
    generation_config under the call's) when the call samples, else nothing."""
    if settings["do_sample"] is not True:
        return {}
    return {"do_sample": True, **{n: settings[n] for n in SAMPLING}}


def _saved_generation_config(path: str, config):
    """The generation settings transformers' ``from_pretrained`` would give a model loaded from
    the checkpoint at ``path``: the ``generation_config.json`` beside it (``save_pretrained``
    writes one), else those its ``config`` implies (its eos and pad tokens). Why: a model
    saved with an eos stops there in transformers' ``generate``; read without it, ours ran
    on past the eos."""
    from transformers import GenerationConfig

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isfile(os.path.join(folder, "generation_config.json")):
        return GenerationConfig.from_pretrained(folder)
    return GenerationConfig.from_model_config(config)


def _penalty_skips_padding() -> bool:
    """Whether the installed transformers' ``generate`` leaves each row's left padding out of
    the tokens ``repetition_penalty`` penalizes, so that a padded batch's tokens stay its own.
    Releases differ: a recent one passes each row's padding count to
    ``RepetitionPenaltyLogitsProcessor`` (``prompt_ignore_length``, a tensor of one count per
    row, from the attention mask), an older one penalized the padding ids like the prompt's
    (its processor took no such argument, or one int for every row, which generate never
    passed). So the processor is asked whether it takes a count per row; its signature alone
    would not tell. Without transformers (a Generator of tg.nn's models alone) the padding is
    left out: each row's tokens are then those of its prompt alone."""
    try:
        import torch
        from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    except ImportError:
        return True
    try:
        RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=torch.zeros(1, dtype=torch.long))
    except (TypeError, ValueError):  # no such argument, or one int for all rows
        return False
    return True


def _positions_limit(config) -> int | None:
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings",
                                                           None)


def _architecture(config, max_len: int) -> tuple[Callable, type]:
    """(reads its config, builds our model) for a transformers config, refusing model types
    ``ARCHITECTURES`` lacks and a GPT-2 cache longer than its learned positions."""
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        raise ArgumentError(f"generate: model type {kind!r} is not supported; supported: "
                            f"{sorted(ARCHITECTURES)} (tg.from_torch imports other models "
                            "for single forward passes)")
    limit = _positions_limit(config)
    if kind == "gpt2" and limit is not None and max_len > limit:
        raise ShapeError(f"generate: a cache of {max_len} tokens (max_len) outruns GPT-2's "
                         f"{limit} learned positions (n_positions): shorten the prompt or "
                         f"max_new_tokens, or give max_len <= {limit}")
    return ARCHITECTURES[kind]


class _Graphs(NamedTuple):
    """A generator's two programs' outputs, and what the prefill's cache starts from."""

    prefill: list  # logits, the cache's new versions (and the chosen token on a GPU)
    decode: list
    float_prefill: list  # the prefill's outputs before quantizing (save_quantized's input)
    cache_names: list[str]
    empty: dict[str, np.ndarray]  # zero-length caches


def _weight_names(outputs: list) -> set[str]:
    return {leaf.name for leaf in leaves(outputs) if leaf.op.name == WEIGHT}


class Generator:
    """A prefill and a decode program for one model, batch size and cache length; call it
    (or :meth:`stream`) for each prompt. Reuse it: building compiles both programs (and the
    first call with a left-padded batch a second pair, unless built ``padded=True``)."""

    def __init__(self, model, weights: Mapping[str, np.ndarray] | str | os.PathLike, *,
                 vocab_size: int, max_len: int, max_prompt: int | None = None, batch: int = 1,
                 eos_token_id=None, pad_token_id: int | None = None,
                 repetition_penalty: float | None = None, do_sample: bool = False,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None,
                 seed: int | None = None,
                 quantize: str | None = None, group_size: int | None = None,
                 skip: Sequence[str] = (), prequantized: bool = False, padded: bool = False,
                 **compile_options):
        """``weights``: the state dict (name -> array) or a checkpoint's path, read once for
        both programs: a safetensors file, or a model's folder as ``save_pretrained`` writes
        it (its ``model.safetensors``, or the shards its ``model.safetensors.index.json``
        names). ``eos_token_id`` (an id or a list) ends a row, which is then
        filled with ``pad_token_id`` (default: the first eos, as transformers).
        ``repetition_penalty``: transformers' (each token already in a row has its score
        divided by it, or multiplied where negative; a left-padded row's padding left out
        where the installed transformers leaves it out), so that its tokens stay
        transformers' under a generation_config that sets one. ``do_sample``: draw each
        token from the softmax of the scores after transformers' warpers (``temperature``,
        ``top_k``, ``top_p``, ``min_p``: None is off), as ``generate(do_sample=True)``; the
        draws come from ``numpy.random.default_rng(seed)``, made once per generator (None:
        fresh entropy), so a new generator with the same seed repeats its tokens. ``quantize``: a
        ``tg.quantize`` scheme for every matmul/linear weight (``skip`` patterns left float,
        ``group_size`` for int4).
        ``prequantized``: the weights hold that scheme's ``<name>.q``/``<name>.scale``
        (``tg.save_quantized``, :meth:`save_quantized`) in place of the float ones, so no
        float copy of a quantized weight is read; from a file, ``quantize`` may be left out
        (the file's metadata names it). ``padded``: build the left-padded batch's programs
        only, which take any batch (an unpadded one as padding 0): one pair compiled rather
        than two where padded batches are expected (``tg.generate`` of one). Every weight is
        checked before either program binds any."""
        from tensor_graphs.rewrite.quantize import quantize as quantize_graph
        from tensor_graphs.runtime.prequantized import (
            check_prequantized,
            file_settings,
            is_path,
            read_prequantized,
        )
        from tensor_graphs.runtime.weights import (
            checkpoint_path,
            is_shard_index,
            read_checkpoint,
        )

        taken = _compile_keywords()
        _unknown("generate", [k for k in compile_options if k not in taken],
                 {"tg.compile's options": taken})
        max_len = _positive_int("max_len", max_len)
        if repetition_penalty is not None and (isinstance(repetition_penalty, bool) or not
                                               isinstance(repetition_penalty, int | float)
                                               or not repetition_penalty > 0):
            raise ArgumentError(f"generate: repetition_penalty must be a positive number (1.0 "
                                f"or None: none), got {repetition_penalty!r}")
        max_prompt = max_len if max_prompt is None else _positive_int("max_prompt", max_prompt)
        if not 1 <= max_prompt <= max_len:
            raise ArgumentError(f"generate: max_prompt={max_prompt} must be in 1..{max_len} "
                                "(max_len)")
        if is_path(weights):
            weights = checkpoint_path(weights)
            if prequantized and is_shard_index(weights):
                raise ArgumentError(f"generate: prequantized=True reads one file "
                                    f"(tg.save_quantized writes one); {weights} is a sharded "
                                    "checkpoint's index")
        if prequantized and is_path(weights):
            quantize, group_size, skip = file_settings(weights, quantize, group_size, skip)
        elif prequantized and quantize is None:
            raise ArgumentError("generate: prequantized=True needs quantize=<scheme> (the "
                                "scheme the .q/.scale weights are in)")
        if skip and quantize is None:
            raise ArgumentError(f"generate: skip={list(skip)!r} names weights to leave float "
                                "under quantize=, which is not given (quantize='int8-weight'...)")
        self.vocab_size, self.max_len, self.max_prompt, self.batch = (vocab_size, max_len,
                                                                      max_prompt, batch)
        eos = [int(e) for e in np.atleast_1d(eos_token_id)] if eos_token_id is not None else []
        self.eos = set(eos)
        self.pad = int(pad_token_id) if pad_token_id is not None else (eos + [0])[0]
        self._padding_id = _padding_id(eos_token_id, pad_token_id)
        self.repetition_penalty = None if repetition_penalty in (None, 1) \
            else float(repetition_penalty)
        self.sampling = _sampler(do_sample, temperature, top_k, top_p, min_p)
        if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)
                                 or seed < 0):
            raise ArgumentError(f"generate: seed must be an int >= 0 (or None), got {seed!r}")
        self._rng = np.random.default_rng(seed)
        # whether the penalty leaves a left-padded row's padding out, as the installed
        # transformers does or not (read once here: it cannot change while the process runs)
        self._penalty_skips_padding = self.repetition_penalty is not None and \
            _penalty_skips_padding()
        options = {"db": None, **compile_options}

        def quantized(outputs: list) -> list:
            if quantize is None:
                return outputs
            return quantize_graph(outputs, quantize, skip=skip, group_size=group_size,
                                  prequantized=prequantized)

        # On a GPU each program also chooses the next token there (argmax, the last output),
        # so a step is queued before the previous token reaches the host (``_ahead``); the
        # repetition penalty and sampling are applied to the logits on the host
        on_gpu = as_device(options.get("device", "cpu")).kind != "cpu"
        self._ahead = on_gpu and self.repetition_penalty is None and self.sampling is None
        self._reader = HostReader()
        options["outputs"] = "device"

        def chosen(logits) -> list:
            return [tg.argmax(logits, axis=-1)] if self._ahead else []

        def graphs(padded: bool) -> _Graphs:
            """The two programs' outputs; ``padded``: with the input ``pad`` (batch,), each
            row's count of left-padding tokens (a padded batch's programs)."""
            # (``pad=`` only where padded: a model written before padding takes none)
            pad = {"pad": tg.input("pad", (batch,), "int64")} if padded else {}
            ids = tg.input("input_ids", (batch, "seq"), "int64")
            prefill_cache = KVCache(max_len)
            prefill_logits = model(ids, cache=prefill_cache, last_only=True, **pad)
            float_prefill = [prefill_logits, *prefill_cache.updates]
            token = tg.input("input_ids", (batch, 1), "int64")
            decode_cache = KVCache(max_len)
            decode_logits = model(token, cache=decode_cache, **pad)
            return _Graphs(quantized(float_prefill + chosen(prefill_logits)),
                           quantized([decode_logits, *decode_cache.updates,
                                      *chosen(decode_logits)]),
                           float_prefill, decode_cache.names(), prefill_cache.empty(batch))

        # a padded batch's programs are built on its first call (``_padded_programs``)
        self._graphs, self._options, self._padded = graphs, options, None
        self._padded_only = bool(padded)
        built = self._padded_graphs() if padded else graphs(padded=False)
        prefill_outputs, decode_outputs, float_prefill = built[:3]
        # the weights, read once for both programs and all checked before compiling either
        wanted = {leaf.name: leaf for outputs in (prefill_outputs, decode_outputs)
                  for leaf in leaves(outputs) if leaf.op.name == WEIGHT}
        from_file = is_path(weights)
        if from_file:
            weights = read_prequantized(weights, wanted, quantize) if prequantized else \
                read_checkpoint(weights, {n: (tuple(lf.shape), lf.dtype)
                                          for n, lf in wanted.items()})
        missing = sorted(set(wanted) - set(weights))
        if missing:
            hint = (" (a prequantized state dict holds <name>.q and <name>.scale for each "
                    "quantized weight: tg.save_quantized)" if prequantized else "")
            raise ArgumentError(f"generate: the model's state dict lacks {missing[:5]}"
                                f"{' ...' if len(missing) > 5 else ''}{hint}")
        if prequantized and not from_file:  # (a file's values are checked as it is read)
            check_prequantized({n: weights[n] for n in wanted}, quantize, where="generate",
                               expected=wanted)
        # save_quantized's inputs: the float graph and how it was quantized; the float
        # weights are read back from the prefill program then (CompiledGraph.bound_weights),
        # so no reference here keeps a host copy of them alive on a GPU build
        self._float = (float_prefill, quantize, skip, group_size) \
            if quantize is not None and not prequantized else None
        self.prefill, self.decode = self._compiled(built)
        self.cache_names, self._empty = built.cache_names, built.empty
        for prog, outputs in ((self.prefill, prefill_outputs), (self.decode, decode_outputs)):
            prog.bind(**{n: weights[n] for n in _weight_names(outputs)})
        if self._padded_only:
            self._padded = (self.prefill, self.decode)

    def _compiled(self, built: _Graphs) -> tuple:
        from tensor_graphs.compiler import compile as compile_graph

        return (compile_graph(built.prefill, bounds={"seq": self.max_prompt, "past": 1},
                              **self._options),
                # a cache of one token (a 1-token prompt, 1 new token) runs no decode step, but
                # the compiler needs a bound of at least 1: the program is built, never run
                compile_graph(built.decode, bounds={"past": max(self.max_len - 1, 1)},
                              **self._options))

    def _padded_graphs(self) -> _Graphs:
        try:
            return self._graphs(padded=True)
        except TypeError as exc:
            if "'pad'" not in str(exc):
                raise
            raise ArgumentError(f"generate: a left-padded batch needs a model that takes "
                                f"pad= (each row's padding; tg.nn's GPT2 and Llama do), and "
                                f"this one does not ({exc}); generate prompts of different "
                                "lengths in separate calls") from None

    def _padded_programs(self) -> tuple:
        """The prefill and decode programs of a left-padded batch, compiled on its first
        call: they take ``pad`` (each row's count of padding tokens) beside the ids, which
        sets each row's positions and hides its padding from its real tokens. Their weights
        are the first pair's values as those hold them (a GPU's tensors are shared, not
        copied again; what a plan prepares from them, a packed weight, is its own)."""
        if self._padded is None:
            built = self._padded_graphs()
            programs = self._compiled(built)
            for prog, first, outputs in zip(programs, (self.prefill, self.decode),
                                            (built.prefill, built.decode)):
                prog.bind(**first.bound_weights(_weight_names(outputs), on_host=False))
            self._padded = programs
        return self._padded

    def _programs(self) -> list:
        extra = self._padded if self._padded and not self._padded_only else ()
        return [self.prefill, self.decode, *extra]

    def save_quantized(self, path, *, metadata: Mapping[str, str] | None = None) -> list[str]:
        """Write this generator's weights, quantized as it was built (``quantize=``, from
        float weights), as the safetensors file a prequantized generator loads
        (:meth:`from_safetensors`, or ``Generator(..., weights=path, prequantized=True)``):
        ``<name>.q``/``<name>.scale`` per quantized weight, the other weights float. Returns
        the tensor names written."""
        from tensor_graphs.runtime.prequantized import save_quantized

        if self._float is None:
            raise ArgumentError("generate: save_quantized needs a generator built with "
                                "quantize=<scheme> from float weights (this one is float or "
                                "loaded prequantized already)")
        outputs, scheme, skip, group_size = self._float
        # the prefill program binds every float weight (its graph quantizes them at bind time)
        names = {leaf.name for leaf in leaves(outputs) if leaf.op.name == WEIGHT}
        return save_quantized(path, outputs, self.prefill.bound_weights(names), scheme,
                              skip=skip, group_size=group_size, metadata=metadata)

    @classmethod
    def from_safetensors(cls, path, config, *, max_len: int, max_prompt: int | None = None,
                         batch: int = 1, quantize: str | None = None,
                         group_size: int | None = None, skip: Sequence[str] = (),
                         eos_token_id=None, pad_token_id: int | None = None,
                         repetition_penalty: float | None = None,
                         **options) -> Generator:
        """The generator of a transformers ``config`` (``ARCHITECTURES``) with its weights
        read from the checkpoint at ``path``, no torch model built. ``path``: a safetensors
        file, a sharded checkpoint's ``model.safetensors.index.json``, or the folder
        ``save_pretrained`` wrote (either inside). A file written by
        :meth:`save_quantized` / ``tg.save_quantized`` (its metadata names the scheme) loads
        prequantized, a float checkpoint as it is (or quantized at bind time, ``quantize=``);
        a file of ``.q``/``.scale`` pairs without that metadata (``prequantized_weights``
        written by ``write_safetensors``) loads prequantized, given ``quantize=``.
        The generation settings are transformers': the ``generation_config.json`` beside the
        checkpoint, else the config's eos and pad tokens, under the ones given here
        (``do_sample=True`` and its warpers among ``options``, the others ``tg.compile``'s)."""
        from tensor_graphs.runtime.prequantized import SCHEME_KEY
        from tensor_graphs.runtime.weights import (
            checkpoint_path,
            is_shard_index,
            read_safetensors_header,
        )

        read, build = _architecture(config, max_len)
        path = checkpoint_path(path)
        prequantized = False
        if not is_shard_index(path):
            header = read_safetensors_header(path)
            # Why the pairs too: a file without the metadata, read as a float checkpoint,
            # refused its own .q/.scale as missing float weights, even with quantize= naming
            # what they hold (Generator(..., prequantized=True) takes such a file); now it
            # loads so, and without quantize= is refused asking for it (file_settings)
            prequantized = SCHEME_KEY in (header.metadata or {}) or \
                any(n.endswith(".q") and n[:-2] + ".scale" in header.tensors
                    for n in header.tensors)
        call = {k: v for k, v in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id),
                                  ("repetition_penalty", repetition_penalty)) if v is not None}
        call.update((k, v) for k, v in options.items() if k in _SETTINGS)
        compile_options = {k: v for k, v in options.items() if k not in call}
        settings = _generation_settings(_saved_generation_config(path, config), call,
                                        fix='set "{name}" to null in generation_config.json')
        return cls(build(read(config)), path, vocab_size=config.vocab_size, max_len=max_len,
                   max_prompt=max_prompt, batch=batch, eos_token_id=settings["eos_token_id"],
                   pad_token_id=settings["pad_token_id"],
                   repetition_penalty=settings["repetition_penalty"],
                   quantize=quantize, group_size=group_size,
                   skip=skip, prequantized=prequantized, **_sampling_options(settings),
                   **compile_options)

    @classmethod
    def from_transformers(cls, causal_lm, *, max_len: int, max_prompt: int | None = None,
                          batch: int = 1, **options) -> Generator:
        """The generator of a transformers causal LM (``ARCHITECTURES`` lists the model
        types), its weights taken from the module's state dict. ``options``: generation
        settings that replace the model's ``generation_config``'s, as in transformers'
        ``generate`` (``eos_token_id``, ``pad_token_id``, ``repetition_penalty``,
        ``do_sample`` and its warpers; one this generator does not apply only at its
        inactive value), :class:`Generator`'s ``quantize``, ``group_size``, ``skip``,
        ``seed``, and ``tg.compile``'s options."""
        generation = {k: v for k, v in options.items() if k in _SETTINGS}
        compile_options = {k: v for k, v in options.items() if k not in generation}
        taken = _compile_keywords()
        _unknown("generate", [k for k in compile_options if k not in (*_BUILD_OPTIONS, *taken)],
                 {"generation settings": list(_SETTINGS),
                  "Generator's": _BUILD_OPTIONS, "tg.compile's": taken})
        config = causal_lm.config
        read, build = _architecture(config, max_len)
        settings = _generation_settings(getattr(causal_lm, "generation_config", None),
                                        generation)
        model = build(read(config))  # a config not built is refused before any weight is read
        weights = {}
        for name, tensor in causal_lm.state_dict().items():
            if tensor.is_floating_point() and str(tensor.dtype) != "torch.float32":
                raise DTypeError(f"generate: weight '{name}' is {tensor.dtype}; tg.nn models "
                                 "run in float32: call causal_lm.float() first")
            weights[name] = tensor.detach().cpu().numpy()
        return cls(model, weights, vocab_size=config.vocab_size, max_len=max_len,
                   max_prompt=max_prompt, batch=batch, eos_token_id=settings["eos_token_id"],
                   pad_token_id=settings["pad_token_id"],
                   repetition_penalty=settings["repetition_penalty"],
                   **_sampling_options(settings), **compile_options)

    def _check(self, input_ids, max_new_tokens: int, attention_mask=None) -> np.ndarray:
        if hasattr(input_ids, "detach"):
            input_ids = input_ids.detach().cpu().numpy()
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ShapeError(f"generate: input_ids must be integer token ids of shape (batch, "
                             f"seq), got {ids.dtype} {ids.shape}")
        if ids.shape[0] != self.batch:
            raise ShapeError(f"generate: this generator was built for batch {self.batch}, got "
                             f"input_ids of shape {ids.shape}")
        if ids.shape[1] < 1:
            raise ShapeError("generate: the prompt is empty")
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ArgumentError(f"generate: token id {int(ids[where])} at {where} is outside "
                                f"the vocabulary 0..{self.vocab_size - 1}")
        pad = _check_padding(ids, attention_mask, self._padding_id)
        max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
        if ids.shape[1] > self.max_prompt:
            raise ShapeError(f"generate: the prompt has {ids.shape[1]} tokens, more than the "
                             f"{self.max_prompt} this generator takes (max_prompt); build the "
                             f"generator with max_prompt={ids.shape[1]} or more (and max_len "
                             f">= prompt + max_new_tokens - 1), or shorten the prompt")
        cached = ids.shape[1] + max_new_tokens - 1  # the last new token is never fed back
        if cached > self.max_len:
            raise ShapeError(f"generate: {ids.shape[1]} prompt tokens + {max_new_tokens} new "
                             f"ones need a cache of {cached} tokens; it holds {self.max_len} "
                             "(build the generator with a larger max_len)")
        return ids.astype(np.int64, copy=False), pad

    def stream(self, input_ids, max_new_tokens: int, *,
               attention_mask=None) -> Iterator[np.ndarray]:
        """Yield each step's tokens, shape (batch,), as soon as they are chosen. Checks the
        input before any work, so a bad call leaves the caches as they were.
        ``attention_mask``: as a tokenizer gives it, left-padded (see ``__call__``)."""
        ids, pad = self._check(input_ids, max_new_tokens, attention_mask)
        max_new_tokens = int(max_new_tokens)  # (checked: an integer of any type)
        return self._tokens(ids, max_new_tokens, pad)

    def _runs(self) -> tuple[int, ...]:
        return tuple(prog.stats["calls"] for prog in self._programs())

    def _tokens(self, ids: np.ndarray, max_new_tokens: int, pad: np.ndarray | None
                ) -> Iterator[np.ndarray]:
        if pad is None and self._padded_only:
            pad = np.zeros(self.batch, np.int64)
        prefill, decode = (self.prefill, self.decode) if pad is None \
            else self._padded_programs()
        feeds = {} if pad is None else {"pad": pad}
        prefill.bind(**self._empty)
        results = prefill(input_ids=ids, **feeds)
        decode.bind(**{n: prefill.state(n) for n in self.cache_names})
        if self._ahead:
            yield from self._tokens_ahead(decode, feeds, results[-1], max_new_tokens)
            return
        logits = on_host(results[0])
        runs = self._runs()
        done = np.zeros(self.batch, dtype=bool)
        penalty = self.repetition_penalty
        if penalty is not None:  # the tokens each row holds: the prompt's, then each new one
            seen = np.zeros((self.batch, self.vocab_size), dtype=bool)
            # a row's left padding counts as its tokens only where transformers counts it
            first = pad if pad is not None and self._penalty_skips_padding \
                else np.zeros(self.batch, np.int64)
            held = np.arange(ids.shape[1])[None, :] >= first[:, None]
            seen[np.nonzero(held)[0], ids[held]] = True
        for step in range(max_new_tokens):
            scores = logits[:, -1]
            if penalty is not None:  # transformers' RepetitionPenaltyLogitsProcessor
                scores = np.asarray(scores)
                scores = np.where(seen, np.where(scores < 0, scores * penalty,
                                                 scores / penalty), scores)
            token = scores.argmax(axis=-1).astype(np.int64) if self.sampling is None \
                else self.sampling.choose(scores, self._rng)
            token[done] = self.pad
            yield token
            done |= np.isin(token, list(self.eos))
            if done.all() or step == max_new_tokens - 1:
                return
            if penalty is not None:
                seen[np.arange(self.batch), token] = True
            self._check_runs(runs)
            logits = on_host(decode(input_ids=token[:, None], **feeds)[0])
            runs = self._runs()

    def _tokens_ahead(self, decode, feeds: Mapping, chosen, max_new_tokens: int
                      ) -> Iterator[np.ndarray]:
        """The tokens of a GPU generator, each step queued before the previous step's token
        is read on the host: ``chosen`` (batch, 1) stays on the GPU and is the next step's
        input, and its copy to the host is waited for only after that step is queued, so the
        host's work per step overlaps the GPU's. A row that ended is fed its argmax rather
        than the pad token (rows are independent: the others' tokens are the same, and the
        ended row's tokens are replaced by the pad token); a stop at an eos leaves one step
        computed and unread."""
        reader = self._reader
        done = np.zeros(self.batch, dtype=bool)
        pending = reader.start(chosen)
        runs = self._runs()
        for step in range(max_new_tokens):
            ahead = None
            if step < max_new_tokens - 1:
                self._check_runs(runs)
                chosen = decode(input_ids=chosen, **feeds)[-1]
                runs = self._runs()
                ahead = reader.start(chosen)
            token = pending()[:, 0].astype(np.int64)
            token[done] = self.pad
            yield token
            done |= np.isin(token, list(self.eos))
            if done.all():
                return
            pending = ahead

    def _check_runs(self, runs: tuple[int, ...]) -> None:
        if self._runs() != runs:
            # another call's prefill or decode ran since this stream's last step: the caches
            # hold its tokens now, and decoding on would give wrong ones silently
            raise StateError("generate: this stream's KV cache was overwritten by a later "
                             "call on the same Generator (another stream or generation "
                             "ran since this stream's last token); a Generator holds one "
                             "cache: finish (or drop) a stream before starting the next, "
                             "or build one Generator per concurrent stream")

    def __call__(self, input_ids, max_new_tokens: int, *, attention_mask=None) -> np.ndarray:
        """The prompt followed by the greedy tokens, (batch, prompt + new), as transformers'
        ``generate(do_sample=False)`` returns it (it stops early when every row ended).
        ``attention_mask`` (as a tokenizer gives it with the ids): a batch of prompts of
        different lengths left-padded (``padding_side="left"``, as transformers asks of a
        decoder-only model), each row's tokens those of its prompt alone; right padding is
        refused. Without a mask, tokens equal to ``pad_token_id`` (given, and no eos) are
        padding, as transformers infers them. The first padded call compiles a second pair
        of programs (``pad`` is their input)."""
        ids, pad = self._check(input_ids, max_new_tokens, attention_mask)
        max_new_tokens = int(max_new_tokens)  # (checked: an integer of any type)
        new = list(self._tokens(ids, max_new_tokens, pad))
        return np.concatenate([ids, np.stack(new, axis=1)], axis=1)


def _sampler(do_sample, temperature, top_k, top_p, min_p) -> Sampling | None:
    """A Generator's sampling (None: greedy); a warper's value without ``do_sample=True``
    would be ignored in silence, so it is refused."""
    if not isinstance(do_sample, bool):
        raise ArgumentError(f"generate: do_sample must be True or False, got {do_sample!r}")
    warpers = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    if do_sample:
        return Sampling.checked(**warpers)
    given = [name for name, value in warpers.items() if value is not None]
    if given:
        raise ArgumentError(f"generate: {', '.join(given)} are sampling settings and "
                            "do_sample is False: pass do_sample=True to sample with them")
    return None


def _positive_int(name: str, value) -> int:
    """``value`` as an int, any integer type (a NumPy or torch count as readily as Python's),
    else an ArgumentError naming ``name``: a float or bool count is a slip, not a size."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ArgumentError(f"generate: {name} must be a positive int, got {value!r}")
    return int(value)


def _left_padding(real: np.ndarray) -> tuple[np.ndarray | None, str | None]:
    """Each row's count of left-padding tokens where ``real`` (batch, seq) marks the real
    ones (None: no row padded), or why there is none: padding must come before a row's
    tokens, as a tokenizer with ``padding_side="left"`` puts it; a row padded after or between
    its tokens, or made of padding only, would not have its own prompt's positions."""
    if real.all():
        return None, None
    pad = real.argmax(axis=1)  # the first real token of each row
    empty = ~real.any(axis=1)
    holes = ~empty & (real.sum(axis=1) != real.shape[1] - pad)
    problems = []
    if empty.any():
        problems.append(f"rows {np.flatnonzero(empty).tolist()} padding only (each row needs "
                        "a token)")
    if holes.any():
        problems.append(f"rows {np.flatnonzero(holes).tolist()} padded after a real token "
                        "(right padding, or a gap; a decoder-only model generates from "
                        "left-padded prompts: tokenizer.padding_side = 'left')")
    return (None, "; ".join(problems)) if problems else (pad.astype(np.int64), None)


def _padding_id(eos_token_id, pad_token_id) -> int | None:
    """The id by which transformers' generate, given no attention_mask, takes prompt tokens
    for padding: a pad_token_id that is no eos (a pad left out defaults to the first eos,
    and a pad equal to an eos infers nothing); None where it infers no padding."""
    if pad_token_id is None:
        return None
    eos = [] if eos_token_id is None else [int(e) for e in np.atleast_1d(eos_token_id)]
    return None if int(pad_token_id) in eos else int(pad_token_id)


def _check_padding(ids: np.ndarray, mask, padding_id: int | None) -> np.ndarray | None:
    """Each row's count of left-padding tokens (None: none), from ``mask`` (an
    attention_mask, 0 marking padding) or, with no mask, as transformers' generate infers it:
    given a ``pad_token_id`` that is no eos, it takes every prompt token equal to it for
    padding (``attention_mask = input_ids != pad``). Padding not on the left is refused."""
    if mask is not None:
        if hasattr(mask, "detach"):
            mask = mask.detach().cpu().numpy()
        given = np.asarray(mask)
        mask = given[None, :] if given.ndim == 1 else given
        if mask.shape != ids.shape:
            raise ShapeError(f"generate: attention_mask has shape {given.shape}; input_ids "
                             f"{ids.shape}")
        pad, problem = _left_padding(mask != 0)
        if problem is not None:
            raise ArgumentError(f"generate: attention_mask has {problem}")
        return pad
    if padding_id is None:
        return None
    pad, problem = _left_padding(ids != padding_id)
    if problem is not None:
        rows = sorted({int(r) for r in np.argwhere(ids == padding_id)[:, 0]})
        raise ArgumentError(
            f"generate: input_ids rows {rows} hold pad_token_id={padding_id} and no "
            "attention_mask is given: transformers' generate takes those tokens for padding "
            f"(it infers attention_mask = input_ids != pad_token_id), which has {problem}; "
            "pass attention_mask=np.ones_like(input_ids) if they are real tokens")
    return pad


# tg.generate's max_new_tokens where neither the call nor the model's generation_config sets it
DEFAULT_MAX_NEW_TOKENS = 32


def _max_new_tokens(given, generation_config) -> int:
    """The call's ``max_new_tokens``, else the model's ``generation_config.max_new_tokens``
    (transformers' generate reads it there: a checkpoint saved with one generates that many
    tokens), else ``DEFAULT_MAX_NEW_TOKENS``; a bad value from the config is named as the
    config's, so the error points at what to fix."""
    if given is not None:
        return _positive_int("max_new_tokens", given)
    configured = getattr(generation_config, "max_new_tokens", None)
    if configured is None:
        return DEFAULT_MAX_NEW_TOKENS
    try:
        return _positive_int("max_new_tokens", configured)
    except ArgumentError:
        raise ArgumentError(f"generate: the model's generation_config sets max_new_tokens="
                            f"{configured!r}, which must be a positive int: pass "
                            "max_new_tokens=N to this call, or set "
                            "causal_lm.generation_config.max_new_tokens to a positive int"
                            ) from None


def generate(causal_lm, input_ids, max_new_tokens: int | None = None, stream: bool = False, *,
             max_len: int | None = None, attention_mask=None, **options):
    """Greedy decoding (or, with ``do_sample=True``, sampling) of a transformers causal LM with
    a KV cache held in ``tg.state``.

    Returns the prompt and new tokens, (batch, prompt + new), like transformers' ``generate``;
    ``stream=True`` returns an iterator of each step's tokens (batch,) instead.
    ``max_new_tokens`` left out: the model's ``generation_config.max_new_tokens`` where it sets
    one (as transformers' generate takes it, so a checkpoint's generation_config.json gives
    the same number of tokens in both), else ``DEFAULT_MAX_NEW_TOKENS`` (32). ``max_len``
    (default: exactly prompt + max_new_tokens - 1, as the last new token is never fed back)
    sizes the cache. ``options``: generation settings over the model's generation_config
    (``eos_token_id``, ``pad_token_id``, ``repetition_penalty``; ``do_sample=True`` with
    ``temperature``, ``top_k``, ``top_p``, ``min_p`` as transformers reads them, and ``seed``
    for repeatable draws), the build and compile options (``Generator.from_transformers``).
    ``attention_mask``: as a tokenizer gives it; prompts of different lengths left-padded
    (``padding_side="left"``), each row's tokens those of its prompt alone.
    Builds a :class:`Generator` each call; keep one (``Generator.from_transformers``) to reuse
    its compiled programs.
    """
    if hasattr(input_ids, "detach"):
        input_ids = input_ids.detach().cpu().numpy()
    ids = np.asarray(input_ids)
    ids = ids[None, :] if ids.ndim == 1 else ids
    if ids.ndim != 2:
        raise ShapeError(f"generate: input_ids must have shape (batch, seq), got {ids.shape}")
    if ids.shape[1] < 1:
        raise ShapeError("generate: the prompt is empty")
    max_new_tokens = _max_new_tokens(max_new_tokens, getattr(causal_lm, "generation_config",
                                                             None))
    needed = ids.shape[1] + max_new_tokens - 1  # the last new token is never fed back
    if max_len is None:
        max_len = needed
    elif _positive_int("max_len", max_len) < needed:
        raise ShapeError(f"generate: {ids.shape[1]} prompt tokens + {max_new_tokens} new ones "
                         f"need a cache of {needed} tokens; max_len={max_len} holds fewer "
                         "(raise max_len, or leave it out to size the cache exactly)")
    _architecture(causal_lm.config, max_len)  # a model not built here, named first
    # the padding check of the generator's call, made before it compiles anything
    settings = _generation_settings(getattr(causal_lm, "generation_config", None),
                                    {k: v for k, v in options.items()
                                     if k in _SETTINGS})
    if ids.dtype.kind in "iu" and _check_padding(
            ids, attention_mask, _padding_id(settings["eos_token_id"],
                                             settings["pad_token_id"])) is not None:
        options.setdefault("padded", True)  # its programs only: one compile, not two
    gen = Generator.from_transformers(causal_lm, max_len=max_len, max_prompt=ids.shape[1],
                                      batch=ids.shape[0], **options)
    return gen.stream(ids, max_new_tokens, attention_mask=attention_mask) if stream \
        else gen(ids, max_new_tokens, attention_mask=attention_mask)
