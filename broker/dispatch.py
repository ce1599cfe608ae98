"""Request code → processor, and every failure → a response code with a remark.

A handler is called with (channel, command) and returns a response, None (no response now: a held pull, an
UNKNOWN end-transaction), or a coroutine producing one of those. Only handlers that await get a task, and each
task is tracked so shutdown can drain them.
"""
from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import Callable

from halfmq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.errors import FrameError
from .channel import Channel
from .errors import error_answer

log = logging.getLogger(__name__)
Handler = Callable[[Channel, RemotingCommand], object]


class Deferred:
    """A handler's answer that is ready when ``future`` is: ``finish(future.result())`` builds the response.

    The hot path (a send waiting for its group commit) uses it instead of a coroutine, which saves a task per
    request. Many Deferreds may share one future (the sends of one burst): it then gets one callback. The
    future may also be a store Completion, whose callback runs as soon as the write is durable.
    """

    __slots__ = ("future", "finish")

    def __init__(self, future: asyncio.Future, finish: Callable[[object], RemotingCommand]):
        self.future = future
        self.finish = finish


class Dispatcher:
    def __init__(self, name: str):
        self.name = name
        self.handlers: dict[int, Handler] = {}
        self.tasks: set[asyncio.Future] = set()
        self._waiting: dict[asyncio.Future, list[tuple]] = {}  # future → the Deferred requests it answers
        self._answered: set[Channel] = set()  # channels with completed answers not yet flushed
        self.close_listeners: list[Callable[[Channel], None]] = []
        self.request_observer: Callable[[int, int, float], None] | None = None
        #: Raises BrokerError when a request is not allowed (ACL, admin codes); None: everything is.
        self.authorize: Callable[[Channel, RemotingCommand], None] | None = None
        #: transport.ConnectionLimits for the connections this dispatcher serves (None: the defaults).
        self.limits = None
        #: The store whose write group a connection holds while it dispatches a burst (hold_group/release_group);
        #: None: the connections' requests do not write.
        self.store = None
        #: request code → the check of a body size its handler applies (raises BrokerError): a request that
        #: declares a body it refuses is answered once its header arrived (``refuse_declared_body``)
        self.body_checks: dict[int, Callable[[int], None]] = {}

    def register(self, code: int, handler: Handler, body_check: Callable[[int], None] | None = None) -> None:
        self.handlers[int(code)] = handler
        if body_check is not None:
            self.body_checks[int(code)] = body_check

    def refuse_declared_body(self, proto, cmd: RemotingCommand, size: int) -> bool:
        """Answer ``cmd``, whose header arrived and whose body of ``size`` bytes has not, when its handler would
        refuse that size (or its caller the request): True when it was answered and its body is not wanted. A
        request refused for its size is then never held whole (a 15 MiB batch was read and buffered again and
        again only to be refused, slowing every other client)."""
        check = self.body_checks.get(cmd.code)
        if check is None or cmd.flag & FLAG_RESPONSE:
            return False
        try:
            if self.authorize is not None:
                self.authorize(proto.channel, cmd)
            check(size)
        except Exception as exc:
            self._reply(proto.channel, cmd, self._error_response(cmd, exc), perf_counter())
            return True
        return False

    def on_channel_closed(self, listener: Callable[[Channel], None]) -> None:
        self.close_listeners.append(listener)

    def channel_closed(self, channel: Channel) -> None:
        for listener in self.close_listeners:
            try:
                listener(channel)
            except Exception:
                log.exception("channel-close listener failed for %s", channel)

    def dispatch(self, proto, cmd: RemotingCommand) -> None:
        channel = proto.channel
        started = perf_counter()
        handler = self.handlers.get(cmd.code)
        if handler is None:
            self._reply(channel, cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                                   f" request type {cmd.code} not supported"))
            return
        try:
            if self.authorize is not None:
                self.authorize(channel, cmd)
            result = handler(channel, cmd)
        except Exception as exc:
            self._reply(channel, cmd, self._error_response(cmd, exc), started)
            return
        if type(result) is Deferred:  # first: the hot path, and iscoroutine is slow
            proto.request_started(len(cmd.body))
            future = result.future
            waiting = self._waiting.get(future)
            if waiting is None:
                waiting = self._waiting[future] = []
                self.tasks.add(future)
                future.add_done_callback(self._complete_all)
            waiting.append((proto, channel, cmd, result.finish, started))
        elif asyncio.iscoroutine(result):
            proto.request_started(len(cmd.body))
            task = asyncio.get_running_loop().create_task(self._run(proto, channel, cmd, result, started))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif result is not None:
            self._reply(channel, cmd, result, started)

    def _complete_all(self, fut: asyncio.Future) -> None:
        """Answer every request ``fut`` completes (the hot path: each send's answer, inlined rather than a call per
        request)."""
        self.tasks.discard(fut)
        answered = self._answered
        cancelled = fut.cancelled()
        value = error = None
        if not cancelled:
            try:
                value = fut.result()
            except Exception as exc:
                error = exc
        for proto, channel, cmd, finish, started in self._waiting.pop(fut):
            proto.request_finished(len(cmd.body))
            if cancelled:
                response = cmd.response(ResponseCode.SYSTEM_BUSY, "[OVERLOAD] broker is shutting down")
            elif error is not None:
                response = self._error_response(cmd, error)
            else:
                try:
                    response = finish(value)
                except Exception as exc:
                    response = self._error_response(cmd, exc)
            self._reply(channel, cmd, response, started)
            answered.add(channel)

    def flush_answers(self) -> None:
        """Write the answers completed since the last call now, one write per channel (the store calls this once
        it resolved a durable group), rather than after the work queued meanwhile."""
        answered, self._answered = self._answered, set()
        for channel in answered:
            channel.flush()

    async def _run(self, proto, channel: Channel, cmd: RemotingCommand, coro, started: float) -> None:
        try:
            response = await coro
        except asyncio.CancelledError:
            self._reply(channel, cmd, cmd.response(ResponseCode.SYSTEM_BUSY, "[OVERLOAD] broker is shutting down"))
            raise
        except Exception as exc:
            response = self._error_response(cmd, exc)
        finally:
            proto.request_finished(len(cmd.body))
        if response is not None:
            self._reply(channel, cmd, response, started)

    def _error_response(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        return error_response(cmd, exc)

    def _reply(self, channel: Channel, request: RemotingCommand, response: RemotingCommand,
               started: float | None = None) -> None:
        if not request.flag & FLAG_ONEWAY:
            try:
                channel.send(response)
            except FrameError as exc:  # e.g. a header over the 24-bit limit: a clear error, not a malformed frame
                log.warning("answer to request %s could not be framed: %s", request.code, exc)
                response = request.response(ResponseCode.SYSTEM_ERROR, f"the answer does not fit in a frame: {exc}")
                channel.send(response)
        if self.request_observer is not None and started is not None:
            self.request_observer(request.code, response.code, perf_counter() - started)

    async def drain(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for in-progress requests, then cancel the rest."""
        if self.tasks:
            # Store Completions are awaitables, not futures: asyncio.wait takes them wrapped in tasks.
            waiting = {t if asyncio.isfuture(t) else asyncio.ensure_future(t) for t in self.tasks}
            _done, pending = await asyncio.wait(waiting, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


def error_response(cmd: RemotingCommand, exc: BaseException) -> RemotingCommand:
    """The answer to ``cmd`` that failed with ``exc`` (the error table in errors.py)."""
    answer = error_answer(exc)
    if answer is not None:
        log.debug("request %s failed: %s", cmd.code, exc)
        return cmd.response(*answer)
    log.error("unexpected error processing request code %s", cmd.code, exc_info=exc)
    return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


def code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)
