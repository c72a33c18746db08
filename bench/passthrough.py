"""The baseline proxy of `bench/e2e.py`: a mitmproxy script whose addon only streams responses.

`mitmdump -s bench/passthrough.py` forwards every response body untouched as it arrives
(`flow.response.stream = True`). With `--set passthrough_callable=true` the body goes through a
stream callable that returns each read as it came: mitmproxy's own cost of calling a stream
function at all, without any work in it.
"""

from mitmproxy import ctx, http


def identity(data: bytes) -> list[bytes]:
    return [data] if data else []


class Passthrough:
    def load(self, loader) -> None:
        loader.add_option(
            "passthrough_callable", bool, False, "Stream through an identity callable instead of `stream = True`."
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        flow.response.stream = identity if ctx.options.passthrough_callable else True


addons = [Passthrough()]
