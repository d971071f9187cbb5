"""Wrap a token iterator (sync or async) so a streamed response is timed without the caller timing it.

    with tracing.request(model="m", stream=True) as req:
        async with tracing.stream(model.generate(prompt)) as tokens:
            async for tok in tokens:
                await send(tok)

The first token records TTFT on the request; the `streaming` stage runs from the first
token until the iterator is exhausted; the number of items (or `count(item)` per item) is
the request's output tokens, from which TPOT follows (the `requests` view derives it).
A stream abandoned before its end (the consumer stopped, was cancelled, or the client
went away: BrokenPipe / ConnectionReset / `ClientDisconnected`) ends the request as
`cancelled`; an error raised by the token source ends it as `error` (or `timeout`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

from tracing import schema as S
from tracing.instrument import (
    STREAMING,
    ClientDisconnected,
    Request,
    StageSpan,
    current_request,
)

__all__ = ["AsyncTokenStream", "TokenStream", "stream"]

T = TypeVar("T")
_OK, _ERROR, _TIMEOUT, _CANCELLED = S.OUTCOMES
_now = time.time_ns


class _StreamState:
    """Bookkeeping shared by the sync and async wrappers."""

    __slots__ = ("_count", "_done", "_end_request", "_span", "request", "tokens")

    def __init__(self, req: Request | None, count: Callable[[Any], int] | None, end_request: bool) -> None:
        self.request = req
        self.tokens = 0
        self._count = count
        self._span: StageSpan | None = None
        self._done = False
        self._end_request = end_request

    @property
    def done(self) -> bool:
        """True once the stream finished, failed or was abandoned."""
        return self._done

    def _on_item(self, item: Any) -> None:
        now = _now()
        req = self.request
        if self._span is None and req is not None and not self._done:
            req.first_token(now)
            self._span = req.start_stage(STREAMING, start_ns=now)
            req._stream = self
        self.tokens += self._count(item) if self._count is not None else 1

    def _finish(self, end_ns: int | None = None) -> None:
        """The stream ended normally: close the stage, set output tokens."""
        if self._done:
            return
        self._done = True
        req = self.request
        if req is None:
            return
        if self._span is not None:
            self._span.end(end_ns)
        req._stream = None
        if req.output_tokens is None:
            req.output_tokens = self.tokens
        if self._end_request:
            req.end(end_ns)

    def _abandon(self, exc: BaseException | None) -> None:
        """The stream stopped early (`exc` None: consumer stopped) or the source raised `exc`."""
        if self._done:
            return
        self._done = True
        req = self.request
        if req is None:
            return
        now = _now()
        reason = exc if exc is not None else ClientDisconnected("stream closed before its end")
        if self._span is not None:
            self._span.fail(reason)
            self._span.end(now)
        req._stream = None
        if req.output_tokens is None:
            req.output_tokens = self.tokens
        if req.outcome in (None, _OK):
            req.fail(reason, streaming=True)
        if self._end_request:
            req.end(now)

    def _exit(self, exc: BaseException | None) -> None:
        if exc is None:
            if not self._done:
                self._abandon(None)
        else:
            self._abandon(exc)


class TokenStream(_StreamState, Generic[T]):
    """A sync token iterator that records TTFT, the streaming stage and output tokens."""

    __slots__ = ("_it",)

    def __init__(self, tokens: Iterable[T], req: Request | None, count: Callable[[T], int] | None,
                 end_request: bool) -> None:
        super().__init__(req, count, end_request)
        self._it: Iterator[T] = iter(tokens)

    def __iter__(self) -> TokenStream[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            item = next(self._it)
        except StopIteration:
            self._finish()
            raise
        except BaseException as exc:
            self._abandon(exc)
            raise
        self._on_item(item)
        return item

    def finish(self) -> None:
        """Declare the stream complete although the consumer stopped reading (e.g. a stop sequence)."""
        self._finish()
        self._close_source()

    def close(self) -> None:
        """Stop early: the request ends `cancelled` unless the stream had finished."""
        self._abandon(None)
        self._close_source()

    def _close_source(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> TokenStream[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._exit(exc)
        self._close_source()


class AsyncTokenStream(_StreamState, Generic[T]):
    """An async token iterator that records TTFT, the streaming stage and output tokens."""

    __slots__ = ("_it",)

    def __init__(self, tokens: AsyncIterable[T], req: Request | None, count: Callable[[T], int] | None,
                 end_request: bool) -> None:
        super().__init__(req, count, end_request)
        self._it: AsyncIterator[T] = aiter(tokens)

    def __aiter__(self) -> AsyncTokenStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await anext(self._it)
        except StopAsyncIteration:
            self._finish()
            raise
        except BaseException as exc:
            self._abandon(exc)
            raise
        self._on_item(item)
        return item

    async def finish(self) -> None:
        """Declare the stream complete although the consumer stopped reading."""
        self._finish()
        await self._close_source()

    async def aclose(self) -> None:
        """Stop early: the request ends `cancelled` unless the stream had finished."""
        self._abandon(None)
        await self._close_source()

    async def _close_source(self) -> None:
        close = getattr(self._it, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> AsyncTokenStream[T]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._exit(exc)
        await self._close_source()


def stream(tokens: Iterable[T] | AsyncIterable[T], request: Request | None = None, *,
           count: Callable[[T], int] | None = None, end_request: bool = False) -> Any:
    """Wrap `tokens` (iterator or async iterator) for the current (or given) request.

    `count(item)` gives the tokens in one item (default 1 per item). With `end_request`
    the request span ends with the stream (handlers that return before streaming ends).
    Returns a `TokenStream` or `AsyncTokenStream`; use it in `with` / `async with` so a
    failure while sending marks the request cancelled.
    """
    req = request if request is not None else current_request()
    if hasattr(tokens, "__aiter__"):
        return AsyncTokenStream(tokens, req, count, end_request)  # type: ignore[arg-type]
    return TokenStream(tokens, req, count, end_request)  # type: ignore[arg-type]
