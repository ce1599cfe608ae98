"""Framing (reference §1.1): a 4-byte length, a 4-byte header word, the header and the body.

``FrameDecoder`` is fed bytes as they arrive and hands back complete frames. It checks the declared
length against its limit before it buffers a frame, so a hostile length costs no memory, and it never allocates a
frame at its declared size: a partial frame holds only the bytes that arrived (``buffered``), which the transport
bounds per connection and across connections. ``frame_head`` refuses a header longer than the 24 bits of the
header word can say (an oversized answer would otherwise be sent as a malformed frame).

A frame being received can be looked at once its header is complete (``pending``) and dropped (``skip_pending``):
its bytes held are freed and the rest of it is discarded as it arrives, so a request refused for its declared size
is never held whole.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import FrameError

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
#: The header length is the low 24 bits of the header word.
MAX_HEADER_LENGTH = 0xFFFFFF
_LEN = struct.Struct(">I")
_PREFIX = struct.Struct(">II")


@dataclass(slots=True)
class Frame:
    serialize_type: int
    header: bytes
    body: bytes


class FrameDecoder:
    """Incremental frame splitter.

    Args:
        max_frame: largest accepted ``frameLength`` (bytes after the length field).
    """

    __slots__ = ("max_frame", "_buf", "_skip", "_shown", "skipped")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        self.max_frame = max_frame
        self._buf = bytearray()
        self._skip = 0  # bytes of a dropped frame still to arrive
        self._shown = False  # the frame being received was handed out by ``pending``
        #: bytes discarded by the last ``feed`` (those of a dropped frame)
        self.skipped = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def pending(self) -> tuple[Frame, int] | None:
        """The frame being received, once its header is complete but not its body: (the frame with an empty
        body, its declared body length), once per frame; None otherwise."""
        buf = self._buf
        if len(buf) < 8 or self._shown:
            return None
        (length,) = _LEN.unpack_from(buf, 0)
        (word,) = _LEN.unpack_from(buf, 4)
        header_len = word & 0xFFFFFF
        if len(buf) < 8 + header_len or len(buf) >= 4 + length:
            return None
        self._shown = True
        return Frame(word >> 24, bytes(buf[8:8 + header_len]), b""), length - 4 - header_len

    def skip_pending(self) -> int:
        """Drop the frame being received (``pending``): the bytes of it held now are freed, those still to come
        are discarded as they arrive. Returns how many bytes of it were held."""
        (length,) = _LEN.unpack_from(self._buf, 0)
        held = len(self._buf)
        self._skip = 4 + length - held
        self._buf = bytearray()
        self._shown = False
        return held

    def feed(self, data: bytes) -> list[Frame]:
        """Add bytes; return the frames now complete (possibly none).

        Raises:
            FrameError: a declared length is out of range; the stream cannot be resynchronised.
        """
        self.skipped = 0
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            self.skipped = skipped
            data = memoryview(data)[skipped:]
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        # Through a memoryview each part is copied once (a bytearray slice would copy it twice).
        with memoryview(buf) as view:
            while end - pos >= 4:
                (length,) = _LEN.unpack_from(buf, pos)
                if length < 4 or length > self.max_frame:
                    self._buf = bytearray()
                    raise FrameError(f"frame length {length} outside 4..{self.max_frame}")
                if end - pos - 4 < length:
                    break
                (word,) = _LEN.unpack_from(buf, pos + 4)
                serialize_type = word >> 24
                header_len = word & 0xFFFFFF
                if header_len > length - 4:
                    self._buf = bytearray()
                    raise FrameError(f"header length {header_len} exceeds frame length {length}")
                start = pos + 8
                frames.append(Frame(serialize_type, bytes(view[start:start + header_len]),
                                    bytes(view[start + header_len:pos + 4 + length])))
                pos += 4 + length
                self._shown = False
        if pos == end:
            # A fresh buffer rather than an emptied one: after a large frame the old one keeps its capacity.
            self._buf = bytearray()
        elif pos:
            del buf[:pos]
        return frames


def encode_frame(serialize_type: int, header: bytes, body: bytes = b"") -> bytes:
    """Build one frame. The header word carries the type in its high byte (JSON = 0)."""
    return frame_head(serialize_type, header, len(body)) + body


def frame_head(serialize_type: int, header: bytes, body_len: int) -> bytes:
    """A frame without its body: what precedes ``body_len`` bytes of body on the wire.

    Raises:
        FrameError: the header is longer than the header word can say, or the frame longer than its length field.
    """
    if len(header) > MAX_HEADER_LENGTH or 4 + len(header) + body_len > 0xFFFFFFFF:
        raise FrameError(f"a header of {len(header)} bytes does not fit in a frame (at most {MAX_HEADER_LENGTH})")
    return _PREFIX.pack(4 + len(header) + body_len, (serialize_type << 24) | len(header)) + header
