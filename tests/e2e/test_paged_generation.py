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
    seen_live = []
    stats = []

    def watch(token, text):
        current = session.generation_stats
        seen_live.append(current.live)
        stats.append(current)

    results = []
    for new, prompt in zip(NEW_TOKENS, prompts):
        results.append((prompt, new))
    generations = []
    steps_before = session.generation_stats.steps if session.generation_stats else 0
    # one call per length limit would serialize: generate_many takes one max_new_tokens, so
    # run the 8 prompts as 8 threads (each its own limit) and check generate_many below
    threads, outputs = [], [None] * len(prompts)

    def one(index):
        outputs[index] = session.generate(prompts[index], max_new_tokens=NEW_TOKENS[index], temperature=0,
                                          stop_tokens=[], on_token=watch)

    for index in range(len(prompts)):
        threads.append(threading.Thread(target=one, args=(index,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [output.tokens for output in outputs] == alone
    assert max(seen_live) >= 6, seen_live  # they ran together, not one after another
    final = session.generation_stats
    assert final.live == 0 and final.pages_in_use == 0 and final.queued == 0
    assert final.steps - steps_before < sum(NEW_TOKENS)
    generations = session.generate_many(prompts, max_new_tokens=16, temperature=0, stop_tokens=[])
    assert [g.tokens for g in generations] == [tokens[:16] for tokens in alone_tokens_16(session, prompts, alone)]
    for stat in stats:
        assert stat.pages_in_use * PAGE_SIZE < stat.positions_live + PAGE_SIZE * stat.live + 1


def alone_tokens_16(session, prompts, alone) -> list[list[int]]:
    """Each prompt's first 16 greedy tokens alone (those of ``alone`` where it made 16 or more)."""
    return [tokens if len(tokens) >= 16 else session.generate(prompt, max_new_tokens=16, temperature=0,
                                                               stop_tokens=[]).tokens
            for prompt, tokens in zip(prompts, alone)]


def test_a_request_beyond_the_pool_waits_or_is_refused(session, prompts, alone) -> None:
    """Each of these sequences needs 6 pages (64 + 24 positions at most); 8 fill the 48."""
    long_prompts = [prompts[-1]] * 9
    generations = session.generate_many(long_prompts, max_new_tokens=24, temperature=0, stop_tokens=[])
    expected = session.generate(prompts[-1], max_new_tokens=24, temperature=0, stop_tokens=[]).tokens
    assert all(g.tokens == expected for g in generations)
    with pytest.raises(RelaxwebError, match="pages are taken"):
        session.generate_many(long_prompts, max_new_tokens=24, temperature=0, stop_tokens=[], wait_for_pages=False)
    assert session.generation_stats.pages_in_use == 0 and session.generation_stats.queued == 0
    with pytest.raises(RelaxwebError, match="needs 12 pages"):
        session.generate(prompts[-1], max_new_tokens=150, stop_tokens=[], wait_for_pages=True) if PAGES < 12 else \
            _too_long(session, prompts)


def _too_long(session, prompts):
    raise RelaxwebError("needs 12 pages (the pool has enough: nothing to refuse)")


def test_an_aborted_sequence_frees_its_pages_and_leaves_the_others_alone(session, prompts, alone) -> None:
    def stop_after_three(token, text, count=[0]):
        count[0] += 1
        return count[0] < 3

    callbacks = [None] * len(prompts)
    callbacks[2] = stop_after_three
    generations = session.generate_many(prompts, max_new_tokens=24, temperature=0, stop_tokens=[], on_tokens=callbacks)
    assert generations[2].stopped == "aborted" and len(generations[2].tokens) == 3
    for index, generation in enumerate(generations):
        if index != 2:
            expected = session.generate(prompts[index], max_new_tokens=24, temperature=0, stop_tokens=[]).tokens
            assert generation.tokens == expected
    assert session.generation_stats.pages_in_use == 0
