"""Incremental decoding of compressed response bodies.

toolshim asks upstream for `accept-encoding: identity`, but a server may compress anyway. The
stream callable then sees compressed bytes, which are decoded here piece by piece (the
`content-encoding` header is dropped so the client gets what it is told it gets).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

Decoder = Callable[[bytes], bytes]  # called with b"" once at the end to flush


def identity(data: bytes) -> bytes:
    """The decoder of a body sent as it is (`incremental_decoder`'s for no encoding)."""
    return data


def incremental_decoder(content_encoding: str) -> Decoder | None:
    """A decoder for the header's encoding, or None when it is not one we can stream."""
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return identity
    if encoding in ("gzip", "x-gzip", "deflate"):
        # wbits 31: gzip framing; 47: detect zlib or gzip framing (what "deflate" means in practice).
        inflater = zlib.decompressobj(31 if "gzip" in encoding else 47)
        return lambda data: inflater.decompress(data) if data else inflater.flush()
    if encoding == "br":
        import brotli  # a mitmproxy dependency

        unbrotli = brotli.Decompressor()
        return lambda data: unbrotli.process(data) if data else b""
    if encoding == "zstd":
        import zstandard  # a mitmproxy dependency

        unzstd = zstandard.ZstdDecompressor().decompressobj()
        return lambda data: unzstd.decompress(data) if data else b""
    return None
