"""Many generations at once on one model (``--kv-pages``: passes/page_kv_caches.py,
runtime/paged_generate.py), on the tiny Llama of ``scripts/tiny_llama.py``, on WebGPU and on
kernels.wasm: 8 greedy generations with different prompts and lengths advanced together give
each prompt's tokens alone (and those of the unpaged bundle), from ``generate_many`` and from
``generate`` called on 8 threads; a 9th request on a pool sized for 8 waits and completes, or
is refused by option; an aborted sequence frees its pages and leaves the others' tokens as
they were; the pages in use follow the live sequences' lengths."""

from __future__ import annotations

import threading

import pytest

import relaxweb
from relaxweb.errors import RelaxwebError
from tests.e2e.test_tiny_llama import BOUNDS, paths, reference, tiny_llama  # noqa: F401  (fixtures)
from tests.helpers import load_bundle

pytestmark = pytest.mark.slow

PAGE_SIZE = 16
#: 8 sequences of up to 64 + 24 positions: 6 pages each at most
PAGES = 48
PROMPT_LENGTHS = (8, 13, 21, 30, 37, 45, 52, 64)
NEW_TOKENS = (24, 9, 17, 24, 12, 20, 5, 16)


@pytest.fixture(scope="module")
def paged_bundle(paths, tmp_path_factory):  # noqa: F811
    return relaxweb.build(paths["model"], tmp_path_factory.mktemp("paged-llama") / "bundle", bounds=BOUNDS,
                          kv_pages=PAGES, kv_page_size=PAGE_SIZE)


@pytest.fixture(scope="module")
def unpaged_bundle(paths, tmp_path_factory):  # noqa: F811
    return relaxweb.build(paths["model"], tmp_path_factory.mktemp("unpaged-llama") / "bundle", bounds=BOUNDS)


@pytest.fixture(scope="module")
def session(paged_bundle, backend):
    return load_bundle(paged_bundle.path, backend)


@pytest.fixture(scope="module")
def prompts(tiny_llama, reference) -> list[list[int]]:  # noqa: F811
    """8 prompts of 8 to 64 tokens, each from a different place of the reference text."""
    ids = tiny_llama.encode(reference["prompt"]) + reference["continuation_ids"]
    return [ids[(7 * index) % 16:(7 * index) % 16 + length] for index, length in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="module")
def alone(session, prompts) -> list[list[int]]:
    """Each prompt's greedy tokens generated alone."""
    return [session.generate(prompt, max_new_tokens=new, temperature=0, stop_tokens=[]).tokens
            for prompt, new in zip(prompts, NEW_TOKENS)]


def test_the_bundle_pages_its_caches(paged_bundle) -> None:
    manifest = paged_bundle.manifest
    assert manifest["kv_pool"] == {"pages": PAGES, "page_size": PAGE_SIZE, "pages_per_sequence": 12, "capacity": 192,
                                   "page_table": len(manifest["inputs"]) - 1}
    names = [entry["name"] for entry in manifest["inputs"]]
    assert "attention_mask" not in names and names[-1] == "kv_page_table"
    pool = next(entry for entry in manifest["inputs"] if entry["name"] == "past_key_values.0.key")
    assert pool["shape"] == [PAGES, 2, PAGE_SIZE, 32]


def test_alone_the_tokens_are_the_unpaged_bundles(alone, prompts, unpaged_bundle, backend) -> None:
    unpaged = load_bundle(unpaged_bundle.path, backend)
    for prompt, new, tokens in list(zip(prompts, NEW_TOKENS, alone))[::3]:
        assert unpaged.generate(prompt, max_new_tokens=new, temperature=0, stop_tokens=[]).tokens == tokens


def test_eight_generations_at_once_give_each_prompts_tokens_alone(session, prompts, alone) -> None:
    """8 threads call generate at once, each with its own prompt and length: they join the same
    steps (6 or more live at once) and each gets its tokens alone; the pages in use never
    exceed the live sequences' positions by more than a page each, and all return at the end."""
    stats = []

    def watch(token, text):
        stats.append(session.generation_stats)

    outputs = [None] * len(prompts)

    def one(index):
        outputs[index] = session.generate(prompts[index], max_new_tokens=NEW_TOKENS[index], temperature=0,
                                          stop_tokens=[], on_token=watch)

    steps_before = session.generation_stats.steps
    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [output.tokens for output in outputs] == alone
    assert max(stat.live for stat in stats) >= 6
    assert session.generation_stats.steps - steps_before < sum(NEW_TOKENS) / 2  # steps were shared
    for stat in stats:
        assert stat.pages_in_use * PAGE_SIZE < stat.positions_live + PAGE_SIZE * stat.live
    final = session.generation_stats
    assert (final.live, final.pages_in_use, final.queued) == (0, 0, 0)


def test_generate_many_gives_each_prompts_tokens_alone(session, prompts, alone) -> None:
    generations = session.generate_many(prompts, max_new_tokens=5, temperature=0, stop_tokens=[])
    assert [g.tokens for g in generations] == [tokens[:5] for tokens in alone]
    assert all(g.stopped == "length" for g in generations)


def test_seeded_sampling_together_is_each_seeds_stream_alone(session, prompts) -> None:
    options = {"max_new_tokens": 12, "temperature": 0.9, "top_k": 20, "stop_tokens": []}
    together = session.generate_many(prompts[:4], seeds=[11, 12, 13, 14], **options)
    for prompt, seed, generation in zip(prompts[:4], [11, 12, 13, 14], together):
        assert session.generate(prompt, seed=seed, **options).tokens == generation.tokens


def test_a_request_beyond_the_pool_waits_or_is_refused(session, prompts) -> None:
    """Each of these sequences may need 6 pages (64 + 24 positions): 8 fill the 48; the 9th
    waits in the queue until one ends, then completes with the same tokens; refused by option;
    one that could never fit is refused at once."""
    queued = []

    def watch(token, text):
        queued.append(session.generation_stats.queued)

    long_prompts = [prompts[-1]] * 9
    generations = session.generate_many(long_prompts, max_new_tokens=24, temperature=0, stop_tokens=[],
                                        on_tokens=[watch] * 9)
    expected = session.generate(prompts[-1], max_new_tokens=24, temperature=0, stop_tokens=[]).tokens
    assert all(g.tokens == expected for g in generations)
    assert max(queued) == 1
    with pytest.raises(RelaxwebError, match="pages are taken: this sequence needs 6 of 48, 0 are not promised to the 0 live sequences and 8 waiting"):
        session.generate_many(long_prompts, max_new_tokens=24, temperature=0, stop_tokens=[], wait_for_pages=False)
    stats = session.generation_stats
    assert (stats.live, stats.pages_in_use, stats.queued) == (0, 0, 0)


def test_an_aborted_sequence_frees_its_pages_and_leaves_the_others_alone(session, prompts, alone) -> None:
    def stop_after_three(token, text, count=[0]):
        count[0] += 1
        return count[0] < 3

    callbacks = [None] * len(prompts)
    callbacks[2] = stop_after_three
    generations = session.generate_many(prompts, max_new_tokens=24, temperature=0, stop_tokens=[], on_tokens=callbacks)
    assert generations[2].stopped == "aborted" and generations[2].tokens == alone[2][:3]
    for index, generation in enumerate(generations):
        if index != 2:
            assert generation.tokens == (alone[index] if NEW_TOKENS[index] == 24 else session.generate(
                prompts[index], max_new_tokens=24, temperature=0, stop_tokens=[]).tokens)
    assert session.generation_stats.pages_in_use == 0
