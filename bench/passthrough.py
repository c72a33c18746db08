"""The baseline proxy of `bench/e2e.py`: a mitmproxy script whose addon only streams responses.

`mitmdump -s bench/passthrough.py` forwards every response body untouched as it arrives
(`flow.response.stream = True`). With `--set passthrough_callable=true` the body goes through a
stream callable that returns each read as it came: mitmproxy's own cost of calling a stream
function at all, without any work in it. With `--set passthrough_parse=true` the callable also
parses and re-serialises each event's JSON with orjson and then returns the read as it came: the
least work any rewrite that reads every event does (the core's "floor", inside mitmdump).
"""

import orjson
from mitmproxy import ctx, http


def identity(data: bytes) -> list[bytes]:
    return [data] if data else []


def parse_each_event(data: bytes) -> list[bytes]:
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: {"):
            try:
                orjson.dumps(orjson.loads(event[6:]))
            except orjson.JSONDecodeError:  # (an event the network cut in two: left unparsed, rarely)
                pass
    return [data] if data else []


class Passthrough:
    def load(self, loader) -> None:
        loader.add_option(
            "passthrough_callable", bool, False, "Stream through an identity callable instead of `stream = True`."
        )
        loader.add_option(
            "passthrough_parse", bool, False, "Stream through a callable that parses and re-serialises each event (orjson)."
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if ctx.options.passthrough_parse:
            flow.response.stream = parse_each_event
        else:
            flow.response.stream = identity if ctx.options.passthrough_callable else True


addons = [Passthrough()]
