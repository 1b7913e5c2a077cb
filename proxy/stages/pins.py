"""The pins stage: an MCP `tools/call` of a tool whose definition changed since it was pinned
(docs/mcp.md "Changed tools"), held for a person, refused, or let through as the agent's
`tool_pins` config says; and the findings of the session's lists written to its run first.

It runs right after the session stage, before the guards: a call a person has not cleared is not
counted, reserved or forwarded. A held call goes through the approvals service (SPEC §5.5a) like
any `ask`: approving re-pins the new definition (the tool is listed again) and forwards the call;
denying keeps the tool out of lists and refuses its calls; a timeout changes nothing (the call
gets `ask_fallback`'s block, the change stays pending).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from proxy.constants import TAG_AWAITING_APPROVAL, EventType
from proxy.exchange import Answer, Exchange
from proxy.guard_events import is_tool_call
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe
from proxy.guards.permissions import SERVER_SEPARATOR
from proxy.mcp import jsonrpc
from proxy.mcp.jsonrpc import MCPToolCall
from proxy.mcp.observe import MessageObserver
from proxy.pins.decide import ADDED, GUARD_TOOL_CHANGED, HIDDEN_INSTRUCTIONS, Change, Finding
from proxy.pins.definitions import markers_in
from proxy.pipeline import BaseStage
from proxy.refusals import write_refusal_error
from proxy.sessions import Session

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.pins")


def own_tool_name(call: MCPToolCall) -> str:
    """The tool's name on its server (an aggregated call carries `SERVER__TOOL`)."""
    prefix = call.server + SERVER_SEPARATOR
    if call.aggregated and call.tool_name.startswith(prefix):
        return call.tool_name[len(prefix) :]
    return call.tool_name


def change_summary(server: str, tool: str, change: Change, pinned: dict[str, Any] | None) -> dict[str, Any]:
    from proxy.pins.definitions import diff

    return {
        "server": server,
        "tool": tool,
        "kind": change.kind,
        "status": change.status,
        "hash": change.hash,
        "diff": diff(pinned, change.definition),
    }


class PinStage(BaseStage):
    name = "pins"
    fail_open = True

    def __init__(self, services: Services) -> None:
        self.services = services

    async def request(self, ex: Exchange) -> None:
        session = ex.session
        if session is None or not is_tool_call(ex) or not isinstance(ex.call, MCPToolCall):
            return
        pins = self.services.pins
        route = ex.route
        for finding in pins.take_findings(route.agent, route.session):
            self.write_state(session, finding.kind, finding.to_json())
        call = ex.call
        server, tool = call.server, own_tool_name(call)
        policy = pins.policy(route.agent, server)
        if policy.off:
            return
        if policy.hidden_instructions == "block" and not self.services.guards.config(route.agent).in_shadow:
            screen_result(ex, call)
        await pins.refresh(server, max_age_s=1.0)
        verdict, change = pins.judge_call(server, tool, route.agent)
        if verdict == "allow" or change is None:
            return
        config = self.services.guards.config(route.agent)
        if config.in_shadow:
            return  # recorded as a finding on the list; nothing held or refused in shadow
        what = "added after the server's tools were pinned" if change.kind == ADDED else "changed"
        decision = Decision(
            Action.ASK if verdict == "ask" else Action.BLOCK,
            GUARD_TOOL_CHANGED,
            f"tool {call.tool_name!r} of MCP server {server!r} was {what}"
            + (" and a person denied the change" if change.status == self.services.approvals.DENIED else "")
            + (": a person must approve its new definition" if verdict == "ask" else ""),
            actual=change.hash[:12],
        )
        if verdict == "block":
            self.refuse(ex, decision)
            return
        await self.hold(ex, session, decision, change, server, tool)

    async def finish(self, ex: Exchange) -> None:
        """A result carrying hidden-instruction markers: a `hidden_instructions` finding in the run."""
        session, call, result = ex.session, ex.call, ex.result
        if session is None or not isinstance(call, MCPToolCall) or result is None:
            return
        content = getattr(result, "result", None)
        if content is None:
            return
        policy = self.services.pins.policy(session.agent, call.server)
        if policy.hidden_instructions == "off":
            return
        markers = markers_in(content)
        if not markers:
            return
        finding = Finding(
            HIDDEN_INSTRUCTIONS, call.server, policy.hidden_instructions, (own_tool_name(call),)
        )
        self.services.pins.count(finding)
        self.write_state(
            session, HIDDEN_INSTRUCTIONS, {**finding.to_json(), "in": "result", "markers": markers}
        )

    async def settle_pin(
        self, act: Callable[[str, str, str | None], Awaitable[bool]], server: str, tool: str, digest: str
    ) -> None:
        """The person's decision written to the pins; a pin store that fails is logged, and the
        held call goes on as decided (its answer may have started already)."""
        try:
            await act(server, tool, digest)
        except Exception:
            log.exception("pins of %r: the decision on %r was not stored", server, tool)

    def write_state(self, session: Session, name: str, payload: dict[str, Any]) -> None:
        policy = self.services.policy
        event_id = policy.write_event(session, EventType.STATE_UPDATE, name, payload)
        policy.observe_event(session, EventType.STATE_UPDATE, name, event_id)

    def refuse(self, ex: Exchange, decision: Decision, note: str = "") -> None:
        assert ex.protocol is not None
        ex.decisions.append(decision)
        self.services.metrics.observe_decision(decision.guard, decision.action.name)
        write_refusal_error(self.services.policy, ex, decision)
        text = describe(decision, self.services.settings.expose_guard_details) + note
        ex.answer = ex.protocol.render_block(ex, decision, text)

    async def hold(
        self, ex: Exchange, session: Session, decision: Decision, change: Change, server: str, tool: str
    ) -> None:
        approvals = self.services.approvals
        pins = self.services.pins
        config = self.services.guards.config(session.agent)
        summary = change_summary(server, tool, change, pins.cached(server).pinned(tool))
        approval = approvals.approval_class(
            id=approvals.approval_class.new_id(),
            agent=session.agent,
            session_id=session.session_id,
            run_id=session.run_id,
            guard=decision.guard,
            kind=None,
            message=decision.message,
            threshold=None,
            actual=decision.actual,
            call={**approvals.held_call(ex, self.services.settings.max_field_bytes), "tool_change": summary},
            approving="pins the tool's new definition (listed again) and forwards this call",
            requested_at=time.time(),
            timeout_s=float(config.ask_timeout_s),
        )
        recorder = self.services.recorder
        decided, stream = await approvals.hold(
            ex,
            approval,
            lambda: self.write_state(session, "approval_requested", {"approval": approval.to_json()}),
            lambda on: (recorder.add_tags if on else recorder.remove_tags)(
                session.run_id, TAG_AWAITING_APPROVAL
            ),
        )
        await self.carry_out(ex, session, decision, approval, decided, stream, change, server, tool)

    async def carry_out(
        self,
        ex: Exchange,
        session: Session,
        decision: Decision,
        approval: Any,  # proxy.approvals.Approval (the stages do not import proxy.approvals)
        decided: Any,  # proxy.approvals.book.Decided
        stream: Any,  # proxy.approvals.hold.HeldStream | None
        change: Change,
        server: str,
        tool: str,
    ) -> None:
        pins = self.services.pins
        self.services.metrics.observe_approval(decision.guard, decided.status)
        self.write_state(
            session,
            "approval_decided",
            {
                "approval_id": approval.id,
                "guardrail": decision.guard,
                "kind": None,
                "decision": decided.status,
                "note": decided.note,
                "by": decided.by,
                "waited_s": round(decided.waited_s, 3),
            },
        )
        if decided.status == self.services.approvals.APPROVED:
            await self.settle_pin(pins.approve, server, tool, change.hash)
            self.write_state(
                session,
                "tool_pinned",
                {"server": server, "tools": [tool], "hash": change.hash, "by": decided.by},
            )
            if stream is not None:
                stream.relay_into()
                ex.held_stream = stream
            return
        if decided.status == self.services.approvals.WITHDRAWN:
            ex.client_disconnected = True
            ex.answer = Answer(400, b"withdrawn: the client hung up while its call was held", "text/plain")
            return
        if decided.status == self.services.approvals.DENIED:
            await self.settle_pin(pins.deny, server, tool, change.hash)
            note = f" A person denied this call{': ' + decided.note if decided.note else '.'}"
        else:
            note = f" Nobody approved this call within {approval.timeout_s:g}s."
        self.refuse(
            ex, Decision(Action.BLOCK, decision.guard, decision.message, actual=decision.actual), note
        )
        if stream is not None and ex.answer is not None:
            await stream.end_with(ex.answer.body, refusal=False)


def screen_result(ex: Exchange, call: MCPToolCall) -> None:
    """`hidden_instructions: block`: the call's result, if it carries hidden-instruction markers,
    reaches the client as a blocked error result instead (recorded as the server sent it). Read as
    the answer passes (a JSON answer is held whole for it); a legacy SSE result is not screened."""
    observer = ex.observer
    if not isinstance(observer, MessageObserver):
        return
    relay = observer.on_message
    call_id = jsonrpc.id_key(call.jsonrpc_id)

    def screened(msg: dict[str, Any]) -> dict[str, Any] | None:
        out = relay(msg)
        seen = out if out is not None else msg
        if jsonrpc.kind(seen) != "response" or jsonrpc.id_key(seen.get("id")) != call_id:
            return out
        markers = markers_in(seen.get("result"))
        if not markers:
            return out
        text = (
            f"[tripwire] blocked: the result of tool {call.tool_name!r} carries hidden-instruction "
            f"markers ({', '.join(markers)}) and was withheld."
        )
        blocked = {"content": [{"type": "text", "text": text}], "isError": True}
        return {"jsonrpc": "2.0", "id": seen.get("id"), "result": blocked}

    observer.on_message = screened
    observer.hold_all_json()


def pin_stage(services: Services) -> BaseStage:
    return PinStage(services)
