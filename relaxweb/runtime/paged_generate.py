"""Many generations at once on one model: continuous batching over a paged KV cache.

A bundle built with ``--kv-pages`` (``passes/page_kv_caches.py``; the manifest's ``kv_pool``)
holds each layer's keys and values in a pool of pages that every sequence shares.  A run
takes the new tokens of every live sequence packed into ``input_ids [1, T]``, each with its
position (``position_ids``) and its sequence's page table (``kv_page_table [1, T, M]``), and
gives each token's logits.  So one run advances all sequences: each decoding one takes one
token; one still reading its prompt takes a chunk of it (the prompt is cut into chunks that
fill the run's token budget, the bound of ``sequence_length``, after the decoding tokens).

:class:`PagedScheduler` (one per session) keeps the state:

- **pages**: each sequence owns a list of pages, taken from the free list as it grows and
  given back when it ends; a request is admitted only when the pages it could need at worst
  (``ceil(min(prompt + max_new_tokens - 1, capacity) / page_size)``) are not promised to the
  live sequences, so a live sequence never runs out;
- **the queue**: requests wait there, in arrival order, until their pages are free (or are
  refused at once with ``wait_for_pages=False``);
- **steps**: :meth:`PagedScheduler.step` admits what fits, runs the model once over the
  packed tokens, picks each sequence's next token with its own sampler (on WebGPU all picks
  of a step are one submit and one read), and retires the sequences that stop (a stop token,
  ``max_new_tokens``, the capacity, or ``on_token`` returning False).

Whoever waits drives: a thread waiting for its requests runs steps while no other thread
does (:meth:`PagedScheduler.wait`), so concurrent ``generate`` calls from several threads
join the same steps, and each returns when its own sequence ends.  ``on_token`` callbacks
run on the thread that runs the step.

The policy is greedy (advance every live sequence every step, admit by arrival while pages
last, decode tokens before prompt chunks); :meth:`PagedScheduler.plan_step` is where another
policy plugs in (``docs/design.md``, "Continuous batching").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.sampler import Sampling
from relaxweb.tokenizer import TextStream

#: The page table input's name (``passes/page_kv_caches.PAGE_TABLE_INPUT``).
PAGE_TABLE = "kv_page_table"


@dataclass(frozen=True)
class PoolLayout:
    """The manifest's ``kv_pool``: pages per pool, positions per page, a page table's entries,
    the longest sequence."""

    pages: int
    page_size: int
    pages_per_sequence: int
    capacity: int

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)


def pool_layout(manifest: Mapping[str, Any]) -> PoolLayout | None:
    """The bundle's paged KV cache layout, None when its caches are not paged."""
    entry = manifest.get("kv_pool")
    if entry is None:
        return None
    return PoolLayout(entry["pages"], entry["page_size"], entry["pages_per_sequence"], entry["capacity"])


@dataclass(frozen=True)
class SchedulerStats:
    """What the scheduler holds now: ``live`` sequences, ``queued`` requests, ``pages_in_use`` of
    ``pages`` of ``page_size`` positions (against the positions the live sequences have written,
    ``positions_live``), and over the steps so far: the tokens made, per second of the steps,
    and per second of the steps that only decoded."""

    live: int
    queued: int
    pages_in_use: int
    pages: int
    page_size: int
    positions_live: int
    tokens_generated: int
    steps: int
    tokens_per_second: float
    decode_tokens: int  # tokens made by the steps that read no prompt chunk
    decode_seconds: float  # and their time
    decode_tokens_per_second: float


@dataclass
class Request:
    """One generation: what was asked, and its state as the scheduler advances it."""

    prompt: list[int]
    max_new_tokens: int
    sampling: Sampling
    uniform: Callable[[], float]
    stops: frozenset[int]
    on_token: Callable[[int, str], Any] | None
    stream: Any
    sampler: Any = None
    pages: list[int] = field(default_factory=list)
    reserved: int = 0
    cached: int = 0  # positions written into its pages
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stopped: str | None = None
    error: BaseException | None = None
    submitted: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.stopped is not None or self.error is not None

    @property
    def prefilled(self) -> bool:
        return self.cached >= len(self.prompt)

    def next_feed(self) -> list[int]:
        """The tokens not yet in its cache: the rest of its prompt, else its last token."""
        return self.prompt[self.cached:] if not self.prefilled else self.tokens[-1:]


class PagedScheduler:
    """The pages, live sequences and queue of one session's paged KV cache (see the module doc)."""

    def __init__(self, session: Any, layout: PoolLayout, signature: Any, make_sampler: Callable[..., Any],
                 sample_batch: Callable[[Any, list[tuple[Any, int, float]]], list[int]]) -> None:
        self.session = session
        self.layout = layout
        self.signature = signature
        self.make_sampler = make_sampler
        self.sample_batch = sample_batch
        manifest = session.manifest
        inputs = {entry["name"]: entry for entry in manifest["inputs"]}
        self.dtypes = {name: np.dtype(entry["dtype"]) for name, entry in inputs.items()}
        bounds = {var["name"]: var["bound"] for var in manifest["symbolic_vars"]}
        tokens_dim = inputs["input_ids"]["shape"][1]
        self.budget = bounds.get(tokens_dim) if isinstance(tokens_dim, str) else tokens_dim
        if not self.budget:
            self.budget = 64
        #: the policy's knobs (bench/many_generations.py varies them): the prompt tokens a step
        #: reads at most (None: the whole budget left after the decoding tokens), and the order
        #: queued requests are admitted in ("arrival", or "shortest" prompt first)
        self.prefill_chunk: int | None = None
        self.admission = "arrival"
        self.pool_shapes = {past: [d for d in inputs[past]["shape"]] for past, _ in signature.cache}
        self.free_pages: list[int] = list(range(layout.pages))
        self.reserved = 0
        self.live: list[Request] = []
        self.queue: deque[Request] = deque()
        self.pools: dict[str, Any] | None = None  # the presents the last step kept (views of the pools)
        self.condition = threading.Condition()
        self.driving = False
        self.steps = 0
        self.tokens_generated = 0
        self.busy_seconds = 0.0
        self.decode_tokens = 0
        self.decode_seconds = 0.0

    # -- requests -------------------------------------------------------------------------

    def submit(self, request: Request, wait_for_pages: bool = True) -> Request:
        """Queue ``request`` (admitted at the next step its pages allow); with
        ``wait_for_pages`` False, a RelaxwebError now when its pages are not free."""
        need = self.layout.pages_for(min(len(request.prompt) + request.max_new_tokens - 1, self.layout.capacity))
        if need > self.layout.pages:
            raise RelaxwebError(f"a sequence of {len(request.prompt)} prompt tokens and up to {request.max_new_tokens} "
                                f"new ones needs {need} pages of {self.layout.page_size} positions, but the pool has "
                                f"{self.layout.pages} (build with a larger --kv-pages, or ask for fewer tokens)")
        request.reserved = need
        request.submitted = time.perf_counter()
        with self.condition:
            free = self.layout.pages - self.reserved - sum(queued.reserved for queued in self.queue)
            if not wait_for_pages and need > free:
                raise RelaxwebError(f"the KV cache's pages are taken: this sequence needs {need} of {self.layout.pages}, "
                                    f"{max(free, 0)} are not promised to the {len(self.live)} live sequences and "
                                    f"{len(self.queue)} waiting requests (wait_for_pages=True queues it until they are)")
            self.queue.append(request)
            self.condition.notify_all()
        return request

    def cancel(self, requests: Sequence[Request]) -> None:
        """Take requests not yet admitted out of the queue (a call whose later request was refused)."""
        with self.condition:
            for request in requests:
                if request in self.queue:
                    self.queue.remove(request)
                    request.stopped = "aborted"

    def wait(self, requests: Sequence[Request]) -> None:
        """Return when every request is done, running steps while no other thread does."""
        while True:
            with self.condition:
                while self.driving and not all(r.done for r in requests):
                    self.condition.wait()
                if all(r.done for r in requests):
                    return
                self.driving = True
            try:
                self.step()
            finally:
                with self.condition:
                    self.driving = False
                    self.condition.notify_all()

    def stats(self) -> SchedulerStats:
        with self.condition:
            in_use = self.layout.pages - len(self.free_pages)
            live = sum(r.cached for r in self.live)
            speed = self.tokens_generated / self.busy_seconds if self.busy_seconds > 0 else 0.0
            decode = self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0
            return SchedulerStats(len(self.live), len(self.queue), in_use, self.layout.pages, self.layout.page_size, live,
                                  self.tokens_generated, self.steps, speed, self.decode_tokens, self.decode_seconds,
                                  decode)

    # -- one step -------------------------------------------------------------------------

    def admit(self) -> None:
        """Move queued requests to the live set while their pages are free: in arrival order
        (``admission`` "arrival"), or the shortest prompt first ("shortest")."""
        with self.condition:
            while self.queue:
                request = (self.queue[0] if self.admission == "arrival"
                           else min(self.queue, key=lambda queued: len(queued.prompt)))
                if self.reserved + request.reserved > self.layout.pages:
                    return
                self.queue.remove(request)
                self.reserved += request.reserved
                self.live.append(request)

    def plan_step(self) -> list[tuple[Request, list[int]]]:
        """The tokens of the next run, per sequence: one for each decoding sequence, then chunks
        of the prompts still being read, within the token budget (the greedy policy)."""
        plan: list[tuple[Request, list[int]]] = []
        budget = self.budget
        for request in self.live:
            if request.prefilled and budget > 0:
                plan.append((request, request.next_feed()))
                budget -= 1
        budget = min(budget, self.prefill_chunk or budget)  # the prompt tokens this step reads at most
        for request in self.live:
            if not request.prefilled and budget > 0:
                chunk = request.next_feed()[:budget]
                plan.append((request, chunk))
                budget -= len(chunk)
        return plan

    def step(self) -> None:
        """Admit, run the model once over every live sequence's next tokens, pick and deliver
        (holding the session's run lock: no other run comes between the run and the picks)."""
        with self.session.run_lock:
            self._step()

    def _step(self) -> None:
        self.admit()
        if not self.live:
            return
        started = time.perf_counter()
        plan = self.plan_step()
        try:
            outputs = self.run(plan)
        except BaseException as error:  # the run failed: every live sequence ends with its error
            self.fail_all(error)
            raise
        made = self.tokens_generated
        try:
            self.deliver(plan, outputs["logits"])
        except BaseException as error:  # a failed pick (the run's status, a sampler): every live sequence ends
            self.fail_all(error)
            raise
        finally:
            outputs["logits"].dispose()
            seconds = time.perf_counter() - started
            self.busy_seconds += seconds
            self.steps += 1
            if all(len(tokens) == 1 and request.cached > len(request.prompt) for request, tokens in plan):
                self.decode_tokens += self.tokens_generated - made
                self.decode_seconds += seconds

    def run(self, plan: list[tuple[Request, list[int]]]) -> dict[str, Any]:
        """One run of the model over the plan's tokens, the pools kept for the next step."""
        layout = self.layout
        ids, positions, tables = [], [], []
        for request, tokens in plan:
            for offset, token in enumerate(tokens):
                position = request.cached + offset
                while len(request.pages) <= position // layout.page_size:
                    request.pages.append(self.free_pages.pop())
                ids.append(token)
                positions.append(position)
                tables.append(request.pages)
        table = np.zeros((1, len(ids), layout.pages_per_sequence), np.int32)
        for row, pages in enumerate(tables):
            table[0, row, :len(pages)] = pages
        feeds: dict[str, Any] = {"input_ids": np.array([ids], self.dtypes["input_ids"]),
                                 "position_ids": np.array([positions], self.dtypes["position_ids"]), PAGE_TABLE: table}
        for past, present in self.signature.cache:
            feeds[past] = self.pools[present] if self.pools is not None else np.zeros(self.pool_shapes[past],
                                                                                      self.dtypes[past])
        keep = ["logits", *(present for _, present in self.signature.cache)]
        previous = self.pools
        try:
            outputs = self.session.run(feeds, keep_on_gpu=keep)
        except BaseException:
            self.pools = None  # the pools' contents are lost with the views: the live sequences fail
            for tensor in (previous or {}).values():
                tensor.dispose()
            raise
        self.pools = {present: outputs[present] for _, present in self.signature.cache}
        for tensor in (previous or {}).values():
            tensor.dispose()
        for request, tokens in plan:
            request.cached += len(tokens)
        return outputs

    def deliver(self, plan: list[tuple[Request, list[int]]], logits: Any) -> None:
        """Pick the next token of each sequence whose prompt is read, and retire those that stop."""
        picks, row = [], 0
        for request, tokens in plan:
            row += len(tokens)
            if request.prefilled:
                if request.sampler is None:
                    request.sampler = self.make_sampler(request)
                picks.append((request, row - 1))
        tokens = self.sample_batch(logits, [(request.sampler, row, request.uniform()) for request, row in picks])
        now = time.perf_counter()
        for (request, _), token in zip(picks, tokens):
            if not request.tokens and not request.first_token_at:
                request.first_token_at = now
            self.accept(request, token)
        for request in [r for r in self.live if r.done]:
            self.retire(request)

    def accept(self, request: Request, token: int) -> None:
        """The sequence's next token: kept, streamed, or the reason it stops."""
        if token in request.stops:
            request.stopped = "eos"
            return
        request.tokens.append(token)
        self.tokens_generated += 1
        request.text += request.stream.push(token)
        if request.on_token is not None:
            try:
                if request.on_token(token, request.text) is False:
                    request.stopped = "aborted"
                    return
            except BaseException as error:  # the callback's error ends its own sequence only
                request.error = error
                return
        if (len(request.tokens) == request.max_new_tokens
                or len(request.prompt) + len(request.tokens) > self.layout.capacity):
            request.stopped = "length"

    def retire(self, request: Request) -> None:
        """A finished sequence leaves: its pages go back to the pool."""
        request.finished_at = time.perf_counter()
        with self.condition:
            self.live.remove(request)
            self.free_pages.extend(reversed(request.pages))
            self.reserved -= request.reserved
            request.pages = []
            if request.sampler is not None:
                request.sampler.close()
            self.condition.notify_all()

    def fail_all(self, error: BaseException) -> None:
        for request in list(self.live):
            request.error = error
            self.retire(request)

    def close(self) -> None:
        """Dispose of the pools' views (the session is closing)."""
        for tensor in (self.pools or {}).values():
            tensor.dispose()
        self.pools = None


def new_request(prompt: list[int], *, max_new_tokens: int, sampling: Sampling, uniform: Callable[[], float],
                stops: Iterable[int], on_token: Callable[[int, str], Any] | None, tokenizer: Any) -> Request:
    stream = TextStream() if tokenizer is None else tokenizer.stream()
    return Request(list(prompt), max_new_tokens, sampling, uniform, frozenset(stops), on_token, stream)
