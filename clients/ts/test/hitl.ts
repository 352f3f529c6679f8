// The conformance runner's part for approval and steering: the scenario's
// approve and steer fields, and the observations approvals,
// approvals_asked, steered and counters (see the scenarios' about).
import type { Event, Result, Turn, TurnOptions } from "../src/index.js";

/** What a scenario asks of approval and steering. */
export interface HitlScenario {
  /** Answer every tool_approval_requested event through the client's onApproval. */
  approve?: { decision: "approve" | "deny"; reason?: string };
  /** Steer the turn with text on the first event of kind on ("text_delta"). */
  steer?: { on: string; text: string };
}

/** HitlRun observes one scenario's approvals and steering. */
export class HitlRun {
  private asked = 0;
  private steering?: Promise<void>;
  private steerError?: unknown;

  constructor(private readonly sc: HitlScenario) {}

  /** The options of the scenario's turn. */
  turnOptions(): Pick<TurnOptions, "onApproval"> {
    const a = this.sc.approve;
    if (!a) return {};
    return {
      onApproval: () => {
        this.asked++;
        return { approved: a.decision === "approve", reason: a.reason };
      },
    };
  }

  /** event notes ev, and steers the turn without waiting, as a caller would, on the scenario's event. */
  event(turn: Turn, ev: Event, obs: Record<string, unknown>): void {
    if (this.sc.approve && obs.approvals === undefined) obs.approvals = [];
    if ((this.sc.approve || this.sc.steer) && obs.steered === undefined) obs.steered = 0;
    const p = ev.agent?.payload;
    if (p?.case === "toolApprovalDecided") {
      (obs.approvals as unknown[]).push({ name: p.value.name, approved: p.value.approved, reason: p.value.reason });
    } else if (p?.case === "steered") {
      obs.steered = (obs.steered as number) + 1;
    } else if (p?.case === "textDelta" && this.sc.steer?.on === "text_delta" && !this.steering) {
      this.steering = turn.steer(this.sc.steer.text).then(
        () => {},
        (e: unknown) => {
          this.steerError = e;
        },
      );
    }
  }

  /** done notes what the turn's end says. */
  async done(res: Result | undefined, obs: Record<string, unknown>): Promise<void> {
    await this.steering;
    if (this.steerError !== undefined) throw this.steerError;
    if (!this.sc.approve && !this.sc.steer) return;
    obs.approvals_asked = this.asked;
    if (res) {
      const c = res.counters;
      obs.counters = { approvals_requested: c.approvalsRequested, approvals_denied: c.approvalsDenied, steered: c.steered };
    }
  }
}

