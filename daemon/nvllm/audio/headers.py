"""An upload's container told from its first bytes, and its header checked before any decoder sees it: what it
claims (channels, rate, length) against what was sent, in bounded work (a few chunks or pages read, never
the audio). libsndfile reads many more formats than these four; it is handed only what passes here.

WAV (wav_header.py), FLAC, OGG with Vorbis or Opus, MP3 (an ID3 tag may lead FLAC and MP3).
"""

from __future__ import annotations

from nvllm.audio.audio_error import AudioError
from nvllm.audio.claims import MAX_BLOCKS, SUPPORTED, Header, claims, truncated
from nvllm.audio.wav_header import wav_header

# the first bytes of containers that are audio, just not read here, so the refusal can name them
OTHERS = ((b"FORM", 8, b"AIFF", "AIFF"), (b"FORM", 8, b"AIFC", "AIFF-C"), (b"RF64", 0, b"", "RF64 WAV"),
          (b"BW64", 0, b"", "BW64 WAV"), (b"caff", 0, b"", "CAF"), (b".snd", 0, b"", "Sun AU"),
          (b"#!AMR", 0, b"", "AMR"), (b"\x1a\x45\xdf\xa3", 0, b"", "WebM or Matroska"),
          (b"MAC ", 0, b"", "Monkey's Audio"), (b"wvpk", 0, b"", "WavPack"))


def read_header(data: bytes, max_seconds: float | None) -> Header:
    """The container of `data` and its header's claims, checked; AudioError for anything refused."""
    if not data:
        raise AudioError("the file is empty")
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return wav_header(data, max_seconds)
    if data[:4] == b"OggS":
        return ogg_header(data, max_seconds)
    start = _after_id3(data)
    if data[start:start + 4] == b"fLaC":
        return flac_header(data, start, max_seconds)
    if _mpeg_frame(data, start) is not None:
        return mp3_header(data, start, max_seconds)
    raise AudioError(_not_read(data, start))


def _not_read(data: bytes, start: int) -> str:
    if start:
        return f"an ID3 tag with neither MP3 nor FLAC audio after it; {SUPPORTED} are read"
    if data[:4] == b"RIFF":
        return f"a RIFF file of type {data[8:12]!r}, not WAVE; {SUPPORTED} are read"
    if data[4:8] == b"ftyp":
        return f"MP4 or M4A (AAC) audio is not supported; {SUPPORTED} are"
    if len(data) > 1 and data[0] == 0xFF and data[1] & 0xF6 == 0xF0:
        return f"AAC (ADTS) audio is not supported; {SUPPORTED} are"
    for magic, at, tag, name in OTHERS:
        if data.startswith(magic) and data[at:at + len(tag)] == tag:
            return f"{name} audio is not supported; {SUPPORTED} are"
    return f"not an audio file: {SUPPORTED} are read"


def _after_id3(data: bytes) -> int:
    """Where the audio starts past any ID3v2 tags (their sizes are 28-bit, each byte's top bit clear)."""
    pos = 0
    for _ in range(MAX_BLOCKS):
        if data[pos:pos + 3] != b"ID3":
            return pos
        if len(data) < pos + 10:
            raise truncated("an ID3 tag", 10, len(data) - pos)
        size = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(data[pos + 6:pos + 10]))
        size += 10 if data[pos + 5] & 0x10 else 0          # a footer
        if pos + size > len(data):
            raise truncated("its ID3 tag", size, len(data) - pos)
        pos += size
    raise AudioError("too many ID3 tags")


def flac_header(data: bytes, start: int, max_seconds: float | None) -> Header:
    """FLAC: the STREAMINFO block (rate, channels, total samples), then every metadata block's length."""
    pos, total = start + 4, 0
    for i in range(MAX_BLOCKS):
        if pos + 4 > len(data):
            raise truncated("a FLAC metadata block's header", 4, len(data) - pos)
        kind, size = data[pos] & 0x7F, int.from_bytes(data[pos + 1:pos + 4], "big")
        body = pos + 4
        if body + size > len(data):
            raise truncated("a FLAC metadata block", size, len(data) - body)
        if i == 0:
            if kind != 0 or size < 34:
                raise AudioError("a FLAC file whose first metadata block is not its STREAMINFO")
            # 20 bits rate, 3 bits channels - 1, 5 bits bits per sample - 1, 36 bits total samples
            bits = int.from_bytes(data[body + 10:body + 18], "big")
            rate, channels, total = bits >> 44, (bits >> 41 & 7) + 1, bits & (1 << 36) - 1
            claims(channels, rate, total / rate if total and rate else None, max_seconds)
            if total == 0:      # libsndfile 1.2.2 fails on the last read of such a stream rather than end it
                raise AudioError("a FLAC stream that does not say its length (0 total samples, as a streaming "
                                 "encoder writes it) is not supported")
        last, pos = data[pos] & 0x80, body + size
        if last:
            return Header("FLAC", total / rate, exact=True)
    raise AudioError("too many FLAC metadata blocks")


MAX_PAGE = 27 + 255 + 255 * 255       # an Ogg page's header, segment table and body at their largest


def _ogg_page(data: bytes, at: int) -> tuple[int, int, int, int]:
    """(flags, granule position, body start, body end) of the Ogg page at `at`."""
    if len(data) < at + 27:
        raise truncated("an Ogg page's header", 27, len(data) - at)
    if data[at + 4] != 0:
        raise AudioError(f"a malformed Ogg page (version {data[at + 4]})")
    table = at + 27 + data[at + 26]
    if table > len(data):
        raise truncated("an Ogg page's segment table", table - at, len(data) - at)
    end = table + sum(data[at + 27:table])
    if end > len(data):
        raise truncated("an Ogg page", end - at, len(data) - at)
    return data[at + 5], int.from_bytes(data[at + 6:at + 14], "little"), table, end


def ogg_header(data: bytes, max_seconds: float | None) -> Header:
    """OGG: the codec of the first page's packet (Vorbis or Opus: channels, rate, Opus' pre-skip) and the last
    page, which must be whole and end the stream; its granule position is the length."""
    _, _, body, end = _ogg_page(data, 0)
    packet = data[body:end]
    if packet.startswith(b"\x01vorbis") and len(packet) >= 16:
        channels, rate, skip = packet[11], int.from_bytes(packet[12:16], "little"), 0
    elif packet.startswith(b"OpusHead") and len(packet) >= 19:
        channels, rate, skip = packet[9], 48000, int.from_bytes(packet[10:12], "little")  # Opus counts at 48 kHz
    else:
        raise AudioError(f"OGG with {_ogg_codec(packet)} is not supported; OGG carries Vorbis or Opus here")
    claims(channels, rate, None, max_seconds)
    last = data.rfind(b"OggS", max(0, len(data) - MAX_PAGE))
    flags, granule, _, _ = _ogg_page(data, last)
    if not flags & 4:
        raise AudioError("truncated: the OGG stream ends without its end-of-stream page")
    seconds = None if granule == (1 << 64) - 1 else max(0, granule - skip) / rate
    claims(channels, rate, seconds, max_seconds)
    return Header("OGG", seconds, exact=True)


def _ogg_codec(packet: bytes) -> str:
    for magic, name in ((b"\x7fFLAC", "FLAC"), (b"Speex   ", "Speex"), (b"\x80theora", "Theora video"),
                        (b"fishead\x00", "a Skeleton stream"), (b"\x01vorbis", "a short Vorbis header"),
                        (b"OpusHead", "a short Opus header")):
        if packet.startswith(magic):
            return name
    return "an unknown codec"


MPEG_RATES = (44100, 48000, 32000)


def _mpeg_frame(data: bytes, at: int) -> tuple[int, int, int] | None:
    """(channels, rate, samples per frame) of an MPEG audio frame header at `at` (layer I, II or III), or None
    if there is none."""
    if len(data) < at + 4 or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return None
    version, layer = data[at + 1] >> 3 & 3, data[at + 1] >> 1 & 3     # version 1 and layer 0 are reserved
    bitrate, rate_index = data[at + 2] >> 4, data[at + 2] >> 2 & 3
    if version == 1 or layer == 0 or bitrate == 15 or rate_index == 3:
        return None
    shift = {3: 0, 2: 1, 0: 2}[version]                                # MPEG-1, MPEG-2, MPEG-2.5
    per_frame = {3: 384, 2: 1152, 1: 1152 if version == 3 else 576}[layer]
    return (1 if data[at + 3] >> 6 == 3 else 2), MPEG_RATES[rate_index] >> shift, per_frame


def _vbr_frames(data: bytes, at: int) -> int | None:
    """The frame count of the VBR tag in the first frame (an encoder's Xing or Info tag after the side
    information, Fraunhofer's VBRI at 36), or None where there is none or it gives no count."""
    mpeg1, mono, crc = data[at + 1] >> 3 & 3 == 3, data[at + 3] >> 6 == 3, not data[at + 1] & 1
    xing = at + 4 + 2 * crc + ((17 if mono else 32) if mpeg1 else (9 if mono else 17))
    if data[xing:xing + 4] in (b"Xing", b"Info"):
        has_count = int.from_bytes(data[xing + 4:xing + 8], "big") & 1
        return int.from_bytes(data[xing + 8:xing + 12], "big") if has_count and len(data) >= xing + 12 else None
    if data[at + 36:at + 40] == b"VBRI" and len(data) >= at + 54:
        return int.from_bytes(data[at + 50:at + 54], "big")
    return None


def mp3_header(data: bytes, start: int, max_seconds: float | None) -> Header:
    """MP3: the first frame's channels and rate, and the length its VBR tag counts (LAME always writes one);
    without one, libsndfile (mpg123) estimates the length from the size."""
    frame = _mpeg_frame(data, start)
    assert frame is not None
    channels, rate, per_frame = frame
    frames = _vbr_frames(data, start)
    # the count includes the encoder's and decoder's delays and the padding (LAME: ~2.5 frames), so four are
    # left out: this check is for absurd claims, and libsndfile's exact count is checked against the limit after
    seconds = None if frames is None else max(0, frames - 4) * per_frame / rate
    claims(channels, rate, seconds, max_seconds)
    return Header("MP3", seconds, exact=frames is not None)
