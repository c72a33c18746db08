"""A mitmproxy script for the fault tests (`mitmdump -s addon/toolshim.py -s tests/flow_probe.py`).

Loaded after toolshim, so its hooks run after toolshim's for the same flow: it logs how many
flows toolshim still keeps state for once a flow is done (`response`) or aborted (`error`), e.g.
`flow-probe: error my-model open=0`. A test reads that line from mitmdump's log to see that a
flow's state was freed, without reaching into the proxy process.
"""

from __future__ import annotations

import logging

from mitmproxy import ctx, http

log = logging.getLogger(__name__)


class FlowProbe:
    def response(self, flow: http.HTTPFlow) -> None:
        self._report("response", flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._report("error", flow)

    @staticmethod
    def _report(hook: str, flow: http.HTTPFlow) -> None:
        shim = ctx.master.addons.get("toolshim")
        try:
            model = flow.request.json()["model"]  # the scripted upstream's routing key
        except Exception:
            model = flow.request.path
        log.info("flow-probe: %s %s open=%d", hook, model, len(shim._flows))


addons = [FlowProbe()]
