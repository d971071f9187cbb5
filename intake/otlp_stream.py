"""Decode one large OTLP/JSON document span by span, without building the whole document.

`json.loads` of a 93 MiB line builds about a gigabyte of Python objects before the first
span is decoded. This walk reads the document's outer structure (the request object, its
resourceSpans, their scopeSpans and spans arrays) with a cursor over the text, parses each
span (and each resource and scope) on its own with the standard library's C scanner
(`json.JSONDecoder.raw_decode`), decodes it exactly as `intake.otlp.decode_json` does and hands
the spans over in batches of `chunk_spans`. Memory is the text plus one batch.

The answer is always the one `decode_json` gives: the same rows in the same order, the same
rejections, the same error. Whatever the walk cannot answer exactly by itself (invalid JSON,
a duplicated key, a value of an unexpected type, text not in UTF-8) makes it return None, and
the caller decodes the document whole instead. A resource or scope written after its spans
is read first by walking the spans once without decoding them (twice the parsing, same memory).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from intake.otlp import DecodeResult, Owner, append_json_span, json_attrs
from tracing.rows import SpanBatch, replica_of

_WS = re.compile(r"[ \t\n\r]*")
_MISSING: Any = object()
_SCAN = json.JSONDecoder().raw_decode  # the C scanner; it does not skip leading whitespace


class _Fallback(Exception):
    """The walk met something only the whole-document decoder answers exactly."""


class _Walk:
    """A cursor over one JSON text that walks an ExportTraceServiceRequest's span arrays."""

    def __init__(self, text: str, *, strict: bool, chunk_spans: int, on_chunk: Callable[[SpanBatch], None]) -> None:
        self.s = text
        self.i = 0
        self.strict = strict
        self.chunk_spans = chunk_spans
        self.on_chunk = on_chunk
        self.batch = SpanBatch()
        self.result = DecodeResult()
        #: the first decoding error; the walk goes on without decoding, to check the JSON to its end
        self.error: ValueError | None = None

    # --- the cursor --------------------------------------------------------------------------

    def peek(self) -> str:
        self.i = _WS.match(self.s, self.i).end()  # type: ignore[union-attr]
        return self.s[self.i:self.i + 1]

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise _Fallback
        self.i += 1

    def value(self) -> Any:
        """Parse the JSON value at the cursor and move past it."""
        self.peek()
        try:
            obj, self.i = _SCAN(self.s, self.i)
        except (ValueError, RecursionError):
            raise _Fallback from None
        return obj

    def members(self) -> Iterator[str]:
        """The keys of the object at the cursor; the caller reads (or walks) each value before the next key."""
        self.expect("{")
        if self.peek() == "}":
            self.i += 1
            return
        seen: set[str] = set()
        while True:
            if self.peek() != '"':
                raise _Fallback
            key = self.value()
            if key in seen:  # json.loads keeps the last of repeated keys: leave that to it
                raise _Fallback
            seen.add(key)
            self.expect(":")
            yield key
            ch = self.peek()
            self.i += 1
            if ch == "}":
                return
            if ch != ",":
                raise _Fallback

    def elements(self) -> Iterator[int]:
        """The indices of the array at the cursor; the caller reads each element before the next."""
        self.expect("[")
        if self.peek() == "]":
            self.i += 1
            return
        n = 0
        while True:
            yield n
            n += 1
            ch = self.peek()
            self.i += 1
            if ch == "]":
                return
            if ch != ",":
                raise _Fallback

    def array_or_null(self) -> bool:
        """True at an array; False after a null (an absent list); anything else is not ours to answer."""
        ch = self.peek()
        if ch == "[":
            return True
        if ch == "n" and self.value() is None:
            return False
        raise _Fallback

    def fail(self, exc: ValueError) -> None:
        if self.error is None:
            self.error = exc

    # --- the request -------------------------------------------------------------------------

    def request(self) -> None:
        if self.peek() != "{":
            raise _Fallback
        for key in self.members():
            if key == "resourceSpans":
                if self.array_or_null():
                    for i in self.elements():
                        self.resource_spans(f"resourceSpans[{i}]")
            else:
                self.value()
        if self.peek() != "":
            raise _Fallback  # extra data after the document

    def resource_spans(self, where: str) -> None:
        if self.peek() != "{":
            raise _Fallback
        resource: Any = _MISSING
        owner: Owner | None = None
        later: int | None = None  # where the scopeSpans array starts when it came before the resource
        lists_seen = 0
        for key in self.members():
            if key == "resource":
                resource = self.value() or {}
                if not isinstance(resource, Mapping):
                    raise _Fallback
                owner = self.owner_of(resource, where)
            elif key in ("scopeSpans", "instrumentationLibrarySpans"):
                lists_seen += 1
                if lists_seen > 1:  # both spellings: json.loads and the decoder's precedence decide
                    raise _Fallback
                if self.array_or_null():
                    if resource is _MISSING:
                        later = self.i
                    self.scope_spans_list(where, owner if resource is not _MISSING else None)
            else:
                self.value()
        if later is not None:
            owner = owner if resource is not _MISSING else self.owner_of({}, where)
            end, self.i = self.i, later
            self.scope_spans_list(where, owner)
            self.i = end

    def owner_of(self, resource: Mapping[str, Any], where: str) -> Owner | None:
        if self.error is not None:
            return None
        try:
            attrs = json_attrs(resource.get("attributes"), f"{where}.resource.attributes")
        except ValueError as exc:
            self.fail(exc)
            return None
        return Owner(attrs, attrs.get("service.name", ""), replica_of(attrs), "", "")

    def scope_spans_list(self, where_rs: str, owner: Owner | None) -> None:
        """Walk a scopeSpans array; with `owner` None only check it (its spans are read later, or never)."""
        for j in self.elements():
            where = f"{where_rs}.scopeSpans[{j}]"
            if self.peek() != "{":
                raise _Fallback
            scope: Any = _MISSING
            library: Any = _MISSING
            later: int | None = None
            for key in self.members():
                if key == "scope":
                    scope = self.value()
                elif key == "instrumentationLibrary":
                    library = self.value()
                elif key == "spans":
                    if self.array_or_null():
                        # the scope is known once `scope` is set and truthy, or both spellings were seen
                        known = (scope is not _MISSING and bool(scope)) or (
                            scope is not _MISSING and library is not _MISSING)
                        if not known:
                            later = self.i
                        self.spans(where, self.with_scope(owner, scope, library) if known else None)
                else:
                    self.value()
            if later is not None:
                end, self.i = self.i, later
                self.spans(where, self.with_scope(owner, scope, library))
                self.i = end

    def with_scope(self, owner: Owner | None, scope: Any, library: Any) -> Owner | None:
        if owner is None:
            return None
        chosen = (None if scope is _MISSING else scope) or (None if library is _MISSING else library) or {}
        if not isinstance(chosen, Mapping):
            raise _Fallback
        return Owner(owner.resource, owner.service, owner.replica, str(chosen.get("name", "")),
                      str(chosen.get("version", "")))

    def spans(self, where_ss: str, owner: Owner | None) -> None:
        for k in self.elements():
            sp = self.value()
            if owner is None or self.error is not None:
                continue
            try:
                append_json_span(sp, f"{where_ss}.spans[{k}]", owner, self.batch, self.result,
                                  strict=self.strict, malformed_raises=False)
            except ValueError as exc:
                self.fail(exc)
                continue
            if len(self.batch) >= self.chunk_spans:
                self.on_chunk(self.batch)
                self.batch = SpanBatch()


def decode_json_stream(data: bytes | memoryview, *, strict: bool, chunk_spans: int,
                       on_chunk: Callable[[SpanBatch], None]) -> DecodeResult | None:
    """Decode one OTLP/JSON ExportTraceServiceRequest span by span, as `decode_json` would.

    Spans go to `on_chunk` in batches of up to `chunk_spans`, the last one before returning.
    Returns what was decoded, raises the ValueError `decode_json` would raise (the chunks
    handed over are then void), or returns None when only `decode_json` can answer exactly
    (then the chunks handed over are void too).
    """
    if json.detect_encoding(bytes(data[:4])) != "utf-8":
        return None
    try:
        text = str(data, "utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    walk = _Walk(text, strict=strict, chunk_spans=max(1, chunk_spans), on_chunk=on_chunk)
    try:
        walk.request()
    except _Fallback:
        return None
    if walk.error is not None:
        raise walk.error
    if len(walk.batch):
        on_chunk(walk.batch)
    return walk.result


__all__ = ["decode_json_stream"]
