"""The V2 HTTP client, independent of the I/O library.

:class:`ClientCore` speaks HTTP/1.1 through h11 over a
:class:`~binproto.adapters._server.ByteStream` that a backend opens. Requests
are encoded as buffer lists and written without joining them; responses are
parsed as they are read, and read only as fast as the caller takes events.
"""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn, cast

try:
    import h11
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "h11") from None
import numpy as np

import binproto
from binproto import (
    Event,
    InferenceHeader,
    Limits,
    LocalProtocolError,
    RemoteProtocolError,
    RequestedOutput,
    body_claims,
)
from binproto._assemble import Destinations
from binproto._compression import inflate_whole, normalize_encoding
from binproto._http import header_value

from ._server import (
    BodyReader,
    ByteStream,
    MessageBody,
    ProbesIdle,
    capabilities,
    write_compressed,
)
from .h11 import (
    HTTPError,
    error_message,
    fields_of,
    infer_path,
    remote_error,
    request_for,
    send_body,
    send_compressed,
)

__all__ = ["CLIENT_TIMEOUT", "COMPRESSION_LEVEL", "ClientCore", "HTTPError", "ResponseStream"]

#: The clients' default bound, in seconds, on each wait for the server (for its
#: bytes, or for it to take ours): generous for a slow model, but a server that
#: falls silent does not hang its client forever. None: no bound.
CLIENT_TIMEOUT = 300.0

#: Largest error body the client reads.
MAX_ERROR_BODY = 1 << 20
# Decoded, an error body may grow no further than MAX_ERROR_BODY either.
_ERROR_BODY_LIMITS = Limits(max_decompressed_bytes=MAX_ERROR_BODY)


class ResponseStream:
    """An inference response being received.

    ``status`` and ``http`` (the ``h11.Response``) are known on entry;
    ``async for event in response`` yields the body's parser events as they
    are read; :meth:`tensors` reads the rest into arrays. ``header`` is set
    once HeaderParsed has been returned.
    """

    def __init__(self, http: h11.Response, body: MessageBody) -> None:
        self.http = http
        self.status = http.status_code
        self.body = body

    @property
    def header(self) -> InferenceHeader | None:
        """The response's JSON header, once parsed."""
        return self.body.header

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.body.__aiter__()

    async def next_event(self) -> Event:
        """The next event of the body."""
        return await self.body.next_event()

    async def tensors(self, destinations: Destinations = None) -> dict[str, np.ndarray[Any, Any]]:
        """Every output as an array (received in place when the stream allows it)."""
        return await self.body.tensors(destinations)


def _requested(outputs: Iterable[str | RequestedOutput] | None) -> list[RequestedOutput] | None:
    if outputs is None:
        return None
    return [o if isinstance(o, RequestedOutput) else RequestedOutput(o) for o in outputs]


def _closes(response: h11.Response) -> bool:
    """True when the server will close the connection after ``response``."""
    tokens = header_value(list(response.headers), "connection") or ""
    closing = any(t.strip() == "close" for t in tokens.lower().split(","))
    return closing or response.http_version != b"1.1"


def _closed_or_busy(stream: ByteStream) -> bool:
    """Whether a kept connection must not carry the next request: bytes or
    the end wait on it, or asking failed."""
    try:
        return cast(ProbesIdle, stream).is_readable()
    except (OSError, ValueError):
        return True


def _error(response: h11.Response, data: bytes) -> HTTPError:
    """The error an error response stands for; a gzip or deflate body (one
    the client asked for with ``accept_encoding``) decoded, to at most
    :data:`MAX_ERROR_BODY` bytes, and one in another coding kept as sent."""
    try:
        encoding = normalize_encoding(header_value(list(response.headers), "content-encoding"))
    except RemoteProtocolError:
        encoding = None  # br, zstd, ...: not decoded
    if encoding is not None and data:
        try:
            data = bytes(inflate_whole(memoryview(data), encoding, _ERROR_BODY_LIMITS))
        except RemoteProtocolError as exc:
            return HTTPError(response.status_code, f"the error body could not be decoded: {exc}")
    return error_message(response.status_code, data)


_CLOSED_IN_FLIGHT = "the Client was closed while this request was in flight"


def _from_the_connection(exc: Exception) -> bool:
    """True for what reading or writing a closed connection raises (the
    caller's own exceptions, thrown into a ``stream()`` block, are not)."""
    if isinstance(exc, (RemoteProtocolError, ConnectionError, h11.ProtocolError)):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.EBADF:  # a socket closed under a call
        return True
    trio = sys.modules.get("trio")  # (loaded when a trio client is in use)
    return trio is not None and isinstance(
        exc, (trio.ClosedResourceError, trio.BrokenResourceError)
    )


def _cut_error(response: h11.Response, data: bytes, fault: RemoteProtocolError) -> HTTPError:
    """The error an error response stands for when its body could not be
    read whole: its status kept, with what was read (unless compressed) and
    why the rest is missing, as the httpx adapter reports it."""
    note = f"the error body could not be read: {fault}"
    coded = header_value(list(response.headers), "content-encoding") is not None
    text = "" if coded else data.decode("utf-8", "replace")
    return HTTPError(response.status_code, f"{text} ({note})" if text else note)


def _drop_locals(exc: BaseException) -> None:
    """Clear the locals of binproto's own finished frames in the traceback of
    ``exc`` and of the exceptions chained to it; the traceback stays.

    A failed response's arrays live in those locals, and the body reader and
    the parser keep the fault, which their frames reach: a reference cycle
    that would hold the arrays until the garbage collector runs, not free
    them as the caller lets go of the error. The caller's frames, and frames
    still running, are left alone.
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        fault = stack.pop()
        if fault is None or id(fault) in seen:
            continue
        seen.add(id(fault))
        tb = fault.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            module = str(frame.f_globals.get("__name__", ""))
            if module == "binproto" or module.startswith("binproto."):
                with contextlib.suppress(RuntimeError):  # a frame still running
                    frame.clear()
            tb = tb.tb_next
        stack += (fault.__cause__, fault.__context__)


#: zlib's level for compressed requests: tensor bytes compress little at any
#: level, and level 1 is two to three times faster than the usual 6 on them.
COMPRESSION_LEVEL = 1


class ClientCore:
    """A V2 client on one keep-alive connection, opened on first use.

    Args:
        open_stream: opens a new connection as a ByteStream.
        host: the ``Host`` header.
        zero_copy: receive response tensors in place when the stream allows it
            (compressed responses are decompressed as they are read instead).
        limits: limits for response bodies (decompressed sizes included).
        accept_encoding: sent as the ``Accept-Encoding`` header of inference
            requests (e.g. ``"gzip, deflate"``); the parser decodes gzip and
            deflate responses within ``limits``. None sends no such header.
        request_encoding: ``"gzip"`` or ``"deflate"`` to compress inference
            request bodies (sent chunked, with ``Content-Encoding``, compressed
            a piece at a time at :data:`COMPRESSION_LEVEL`); None sends them as
            they are.

    A client sends one request at a time, over its one connection: a request
    made while another is in flight (from a second task) raises
    :class:`binproto.LocalProtocolError` at once, leaving the connection and
    the first request alone. Use one client per task.
    """

    def __init__(
        self,
        open_stream: Callable[[], Awaitable[ByteStream]],
        *,
        host: str,
        zero_copy: bool = True,
        limits: Limits | None = None,
        accept_encoding: str | None = None,
        request_encoding: str | None = None,
    ) -> None:
        self._open_stream = open_stream
        self._host = host
        self._zero_copy = zero_copy
        self._limits = limits
        self._accept = [] if accept_encoding is None else [("Accept-Encoding", accept_encoding)]
        try:
            self._request_encoding = normalize_encoding(request_encoding)
        except RemoteProtocolError:
            raise LocalProtocolError(
                f"request_encoding must be 'gzip', 'deflate' or None, got {request_encoding!r}"
            ) from None
        self._stream: ByteStream | None = None
        self._conn: h11.Connection | None = None
        self._stream_to_close = False  # the server will not serve another request
        self._busy = False  # a request is in flight
        self._closed_in_flight = False  # aclose() came while it was
        self._failing = False  # it failed on its own (a close in its cleanup is not the cause)

    async def __aenter__(self) -> ClientCore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (a later call opens a new one). A request
        another task has in flight then fails with
        :class:`binproto.LocalProtocolError`."""
        if self._busy and not self._failing:
            self._closed_in_flight = True
        await self._drop_connection()

    async def _drop_connection(self) -> None:
        stream, self._stream, self._conn = self._stream, None, None
        if stream is not None:
            await stream.aclose()

    @contextlib.contextmanager
    def _one_request(self) -> Iterator[None]:
        """Around a request, from before its first await to its end: a second
        request meanwhile (another task's) is refused, not sent on the
        connection this one is using."""
        if self._busy:
            raise LocalProtocolError(
                "a Client sends one request at a time: use one Client per task"
            )
        self._busy = True
        try:
            yield
        except Exception as exc:
            if self._closed_in_flight and _from_the_connection(exc):
                # What the closed connection made of the request (an end of
                # stream, a closed resource) is not the server's fault.
                raise LocalProtocolError(_CLOSED_IN_FLIGHT) from exc
            raise
        finally:
            self._busy = False
            self._closed_in_flight = False
            self._failing = False

    async def _connection(self) -> tuple[ByteStream, h11.Connection]:
        stream = self._stream
        if stream is not None and capabilities(stream).probes_idle and _closed_or_busy(stream):
            # Between requests the server closed the connection (its keep-alive
            # timeout, most often) or sent what no request asked for: a new one.
            await self._drop_connection()
        if self._stream is None or self._conn is None:
            stream = await self._open_stream()
            if self._closed_in_flight:  # aclose() came while it was opening
                await stream.aclose()
                raise LocalProtocolError(_CLOSED_IN_FLIGHT)
            self._stream, self._conn = stream, h11.Connection(h11.CLIENT)
        return self._stream, self._conn

    async def _head(self, stream: ByteStream, conn: h11.Connection) -> h11.Response:
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:  # a garbled head, or a close before it
                raise remote_error(exc) from None
            if type(event) is h11.Response:
                return event
            if event is h11.NEED_DATA:
                data = bytes(await stream.receive_some(1 << 16))
                if not data:
                    raise binproto.RemoteProtocolError(
                        "the server closed the connection without a response"
                    )
                conn.receive_data(data)
            elif type(event) is h11.InformationalResponse:
                continue
            else:
                raise binproto.RemoteProtocolError("the server closed the connection")

    async def get(self, path: str) -> tuple[int, bytes]:
        """A GET request: the status and the (small) body. ``path`` is sent
        as it is (quote what needs quoting)."""
        try:
            head = request_for(path, None, host=self._host, method="GET")
        except h11.LocalProtocolError as exc:
            raise LocalProtocolError(f"cannot send GET {path!r}: {exc}") from None
        with self._one_request():
            stream, conn = await self._connection()
            try:
                await stream.send_all([conn.send(head), conn.send(h11.EndOfMessage())])
                response = await self._head(stream, conn)
                data = await self._small_body(stream, conn)
            except BaseException:
                self._failing = True
                await self._drop_connection()
                raise
            self._next_cycle(conn)
            if self._stream_to_close:
                # The server closes after this response: so do we, and the next
                # call opens a new connection.
                self._stream_to_close = False
                await self._drop_connection()
            return response.status_code, data

    async def _small_body(self, stream: ByteStream, conn: h11.Connection) -> bytes:
        data, fault = await self._read_small(stream, conn)
        if fault is not None:
            raise fault
        return data

    async def _read_small(
        self, stream: ByteStream, conn: h11.Connection
    ) -> tuple[bytes, RemoteProtocolError | None]:
        """A small body (an error's, a GET's), at most :data:`MAX_ERROR_BODY`
        bytes, and the fault that left it incomplete (None: it is whole)."""
        reader = BodyReader(stream, conn, None, receive_in_place=False)
        out = bytearray()
        try:
            while True:
                data = await reader.read()
                if not len(data):
                    return bytes(out), None
                out += data
                if len(out) > MAX_ERROR_BODY:
                    fault = RemoteProtocolError(
                        f"the response body is longer than {MAX_ERROR_BODY} bytes"
                    )
                    return bytes(out[:MAX_ERROR_BODY]), fault
        except Exception as exc:  # cut short, badly framed, or the connection reset
            if not _from_the_connection(exc):
                raise
            fault = (
                exc
                if isinstance(exc, RemoteProtocolError)
                else RemoteProtocolError(str(exc) or type(exc).__name__)
            )
            return bytes(out), fault

    def _next_cycle(self, conn: h11.Connection) -> None:
        # (A response framed by the close ends DONE/DONE too: the peer has
        # closed, which h11 has seen. Bytes past the response, which no
        # request asked for, end the connection too.)
        extra, closed = conn.trailing_data
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE and not (closed or extra):
            conn.start_next_cycle()
        else:
            self._stream_to_close = True

    @contextlib.asynccontextmanager
    async def stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str | RequestedOutput] | None = None,
        binary_data_output: bool | None = None,
        model_version: str | None = None,
        id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        binary: bool | set[str] = True,
    ) -> AsyncIterator[ResponseStream]:
        """Send an inference request and yield the response as it arrives.

        The request body goes out as the encoder's buffer list, never joined.
        An error status raises :class:`~binproto.adapters.h11.HTTPError` (with
        the V2 error message). Leaving the block before the body was read to
        its end closes the connection.
        """
        body = binproto.encode_request(
            inputs,
            outputs=_requested(outputs),
            binary_data_output=binary_data_output,
            parameters=parameters,
            id=id,
            binary=binary,
        )
        if not isinstance(model, str) or not isinstance(model_version, (str, type(None))):
            raise LocalProtocolError("model and model_version must be strings")
        path = infer_path(model, model_version)
        with self._one_request():
            stream, conn = await self._connection()
            ok = False
            result: ResponseStream | None = None
            try:
                try:
                    await self._send_request(stream, conn, path, body)
                except ConnectionError as exc:
                    await self._raise_early_answer(stream, conn, exc)
                response = await self._head(stream, conn)
                if response.status_code != 200:
                    data, fault = await self._read_small(stream, conn)
                    if fault is not None:  # (the connection is closed below: not ok)
                        raise _cut_error(response, data, fault) from fault
                    self._next_cycle(conn)
                    ok = True
                    raise _error(response, data)
                claims = body_claims(fields_of(response))
                reader = BodyReader(
                    stream, conn, claims.content_length, receive_in_place=self._zero_copy
                )
                result = ResponseStream(
                    response, MessageBody("response", claims, reader, limits=self._limits)
                )
                yield result
                ok = result.body.complete and not reader.direct
                if ok:
                    self._next_cycle(conn)
                elif result.body.complete:
                    # h11 did not see the body: a fresh connection state, same socket,
                    # unless the server said it closes, or closed, or sent bytes past
                    # its response (that no request asked for: not to be taken for
                    # the next answer; see also ProbesIdle).
                    extra, closed = reader.rest()
                    self._conn = h11.Connection(h11.CLIENT)
                    self._stream_to_close = _closes(response) or closed or bool(len(extra))
                    ok = True
            except BaseException as exc:
                self._failing = True
                # The fault keeps frames that reach the response (the caller's
                # ``infer`` frame, say): its arrays go now, not when it is collected.
                _drop_locals(exc)
                if result is not None:
                    result.body.release()
                raise
            finally:
                if not ok or self._stream_to_close:
                    self._stream_to_close = False
                    await self._drop_connection()

    async def _raise_early_answer(
        self, stream: ByteStream, conn: h11.Connection, exc: ConnectionError
    ) -> NoReturn:
        """Sending failed: raise the server's answer if it sent one before
        closing (a refusal, e.g. 413, while the body was still going out),
        else ``exc``."""
        try:
            response = await self._head(stream, conn)
            data, fault = await self._read_small(stream, conn)
        except Exception:
            raise exc from None
        if response.status_code == 200:
            raise exc
        if fault is not None:
            raise _cut_error(response, data, fault) from exc
        raise _error(response, data) from exc

    async def _send_request(
        self, stream: ByteStream, conn: h11.Connection, target: str, body: binproto.EncodedBody
    ) -> None:
        encoding = self._request_encoding
        head = request_for(target, body, host=self._host, headers=self._accept, encoding=encoding)
        if encoding is None:
            await stream.send_all([conn.send(head), *send_body(conn, body)])
            return
        batches = send_compressed(conn, body, encoding, level=COMPRESSION_LEVEL)
        await write_compressed(stream, conn.send(head), batches)

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str | RequestedOutput] | None = None,
        binary_data_output: bool | None = None,
        model_version: str | None = None,
        id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        binary: bool | set[str] = True,
        destinations: Destinations = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run inference and return every output as a numpy array.

        ``outputs`` names the outputs wanted (or gives
        :class:`binproto.RequestedOutput` entries); ``binary_data_output`` asks
        for binary outputs; ``binary`` is passed to
        :func:`binproto.encode_request`; ``destinations`` to the assembler.
        """
        async with self.stream(
            model,
            inputs,
            outputs=outputs,
            binary_data_output=binary_data_output,
            model_version=model_version,
            id=id,
            parameters=parameters,
            binary=binary,
        ) as response:
            return await response.tensors(destinations)
