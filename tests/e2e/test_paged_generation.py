"""Many generations at once on one model (``--kv-pages``: passes/page_kv_caches.py,
runtime/paged_generate.py), on the tiny Llama of ``scripts/tiny_llama.py``, on WebGPU and on
kernels.wasm: 8 greedy generations with different prompts and lengths advanced together give
each prompt's tokens alone (and those of the unpaged bundle), from ``generate_many`` and from
``generate`` called on 8 threads; a 9th request on a pool sized for 8 waits and completes, or
is refused by option; an aborted sequence frees its pages and leaves the others' tokens as
they were; the pages in use follow the live sequences' lengths."""

from __future__ import annotations

import threading
import time

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
    start = threading.Barrier(len(prompts))  # all 8 calls come in together

    def one(index):
        start.wait()
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


def test_a_call_that_comes_in_during_a_step_is_queued_before_the_step_ends(session, prompts, alone) -> None:
    """A step holds the session's run lock for its whole run; a generate call that comes in
    meanwhile queues its request at once instead of waiting on that lock (where the thread that
    drives the steps took it back after each step, and ran its whole generation alone)."""
    scheduler = session._paged_scheduler
    done = []
    with session.run_lock:  # as a step of another thread does
        caller = threading.Thread(target=lambda: done.append(
            session.generate(prompts[0], max_new_tokens=2, temperature=0, stop_tokens=[])))
        caller.start()
        deadline = time.monotonic() + 30
        while session.generation_stats.queued == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        queued = session.generation_stats.queued
    caller.join()
    assert queued == 1 and len(done) == 1 and scheduler is session._paged_scheduler


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


# -- in Chromium --

#: Runs in the runner page, on each backend: each prompt's greedy tokens alone, then the 8 at
#: once (generate calls with their own lengths), generateMany, 9 long requests on a pool for 8
#: (the 9th waits), their refusal with waitForPages: false, and an abort by signal.
PAGED_IN_PAGE = """
async ({ prompts, newTokens, longNew }) => {
  const results = {};
  for (const backend of ["webgpu", "wasm"]) {
    const model = await window.relaxweb.load("/bundle/", { backend });
    const greedy = { temperature: 0, stopTokens: [] };
    const stats = () => ({ ...model.generationStats });
    const result = { backend: model.backend, statsBeforeUse: model.generationStats };
    result.alone = [];
    for (const [i, prompt] of prompts.entries()) {
      result.alone.push((await model.generate(prompt, { ...greedy, maxNewTokens: newTokens[i] })).tokens);
    }
    const seen = [];
    const stepsBefore = model.generationStats.steps;
    const together = await Promise.all(prompts.map((prompt, i) => model.generate(prompt, {
      ...greedy, maxNewTokens: newTokens[i], onToken: () => { seen.push(stats()); } })));
    result.together = together.map((g) => g.tokens);
    result.stopped = together.map((g) => g.stopped);
    result.seen = seen;
    result.togetherSteps = model.generationStats.steps - stepsBefore;
    result.afterTogether = stats();
    result.many = (await model.generateMany(prompts, { ...greedy, maxNewTokens: 16 })).map((g) => g.tokens);
    const long = Array(9).fill(prompts[prompts.length - 1]);
    const queued = [];
    const nine = await model.generateMany(long, { ...greedy, maxNewTokens: longNew,
      onTokens: long.map(() => () => { queued.push(model.generationStats.queued); }) });
    result.nine = nine.map((g) => g.tokens);
    result.queued = queued;
    result.refused = await model.generateMany(long, { ...greedy, maxNewTokens: longNew, waitForPages: false })
      .then(() => "no error", (error) => error.message);
    result.afterRefusal = stats();
    const controller = new AbortController();
    let count = 0;
    const withAbort = await Promise.all(prompts.map((prompt, i) => model.generate(prompt, {
      ...greedy, maxNewTokens: newTokens[i],
      ...(i === 2 ? { signal: controller.signal, onToken: () => { if (++count === 3) controller.abort(); } } : {}) })));
    result.withAbort = withAbort.map((g) => g.tokens);
    result.abortedStopped = withAbort[2].stopped;
    result.afterAbort = stats();
    model.dispose();
    results[backend] = result;
  }
  return results;
}
"""

LONG_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def in_chromium(paged_bundle, prompts) -> dict:
    """PAGED_IN_PAGE's results on each backend of the browser runtime."""
    pytest.importorskip("playwright")
    from relaxweb import browser  # noqa: PLC0415  (playwright's, imported when these tests run)

    try:
        browser.find_chromium()
    except RelaxwebError as error:
        pytest.skip(str(error))
    with browser.open_runner_page(paged_bundle.path, webgpu=True) as page:
        return page.evaluate(PAGED_IN_PAGE, {"prompts": prompts, "newTokens": list(NEW_TOKENS), "longNew": LONG_NEW_TOKENS})


@pytest.mark.browser
def test_eight_generate_calls_at_once_in_chromium_give_each_prompts_tokens_alone(in_chromium, alone) -> None:
    """On WebGPU and on wasm: the browser runtime's tokens alone are the Python runtime's, and 8
    concurrent calls give them too, advanced together (at most a step per new token of the
    longest, plus the prompts' chunks), every page back in the pool after."""
    for backend, result in in_chromium.items():
        assert result["backend"] == backend and result["statsBeforeUse"] is None
        assert result["alone"] == alone, backend
        assert result["together"] == alone, backend
        assert result["stopped"] == ["length"] * len(NEW_TOKENS)
        assert max(stat["live"] for stat in result["seen"]) >= 6, backend
        assert result["togetherSteps"] < sum(NEW_TOKENS)
        for stat in result["seen"]:
            assert stat["pagesInUse"] * PAGE_SIZE < stat["positionsLive"] + PAGE_SIZE * stat["live"] + 1, stat
        after = result["afterTogether"]
        assert (after["live"], after["queued"], after["pagesInUse"], after["pages"], after["pageSize"]) == (
            0, 0, 0, PAGES, PAGE_SIZE)


@pytest.mark.browser
def test_generate_many_in_chromium_gives_each_prompts_tokens_alone(in_chromium, session, prompts, alone) -> None:
    expected = [tokens[:16] if len(tokens) >= 16 else session.generate(prompt, max_new_tokens=16, temperature=0,
                                                                         stop_tokens=[]).tokens
                for prompt, tokens in zip(prompts, alone)]
    for backend, result in in_chromium.items():
        assert result["many"] == expected, backend


@pytest.mark.browser
def test_a_request_beyond_the_pool_in_chromium_waits_or_is_refused(in_chromium, session, prompts) -> None:
    """9 sequences of 6 pages on a pool of 48: the 9th waits in the queue, then gives the same
    tokens as the others (the Python runtime's); with waitForPages: false the call is refused
    and leaves nothing queued."""
    expected = session.generate(prompts[-1], max_new_tokens=LONG_NEW_TOKENS, temperature=0, stop_tokens=[]).tokens
    for backend, result in in_chromium.items():
        assert result["nine"] == [expected] * 9, backend
        assert 1 in result["queued"] and 0 in result["queued"], (backend, result["queued"])
        # the 8 before it in the queue take the 48 pages, free as they are
        assert result["refused"] == ("the KV cache's pages are taken: this sequence needs 6 of 48, 0 are not promised "
                                     "to the 0 live sequences and 8 waiting requests (waitForPages: true queues it until "
                                     "they are)"), result["refused"]
        assert (result["afterRefusal"]["queued"], result["afterRefusal"]["pagesInUse"]) == (0, 0)


@pytest.mark.browser
def test_an_aborted_sequence_in_chromium_frees_its_pages_and_leaves_the_others_alone(in_chromium, alone) -> None:
    for backend, result in in_chromium.items():
        assert result["abortedStopped"] == "aborted"
        assert result["withAbort"][2] == alone[2][:3]
        assert [tokens for index, tokens in enumerate(result["withAbort"]) if index != 2] == alone[:2] + alone[3:]
        assert (result["afterAbort"]["live"], result["afterAbort"]["pagesInUse"]) == (0, 0), backend
