"""Runs one turn on a turnstile server (TURNSTILE_ADDR, default 127.0.0.1:7700)
with the Python client and prints its reply as it streams."""
import os
import sys

import turnstile_client as ts
from turnstile_client.v1 import agent_pb2, conversation_pb2

with ts.Client(os.environ.get("TURNSTILE_ADDR", "127.0.0.1:7700")) as client:
    prompt = conversation_pb2.Message(role=conversation_pb2.ROLE_USER, parts=[{"text": " ".join(sys.argv[1:])}])
    turn = client.run_turn(agent_pb2.RunTurnRequest(messages=[prompt]))
    try:
        for ev in turn.events():
            if ev.step_retry:
                print(f"\n[retrying: {ts.code_name(ev.step_retry.error.code)}]")
            elif ev.agent.WhichOneof("payload") == "text_delta":
                print(ev.agent.text_delta.text, end="", flush=True)
        print("\n" + agent_pb2.EndReason.Name(turn.result.end_reason))
    except ts.TurnError as e:
        sys.exit(f"\n{e}")
