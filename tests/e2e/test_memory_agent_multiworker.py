"""memory_agent at 4 workers: every conversation continues, whichever worker each turn reaches."""

from __future__ import annotations

from tests.e2e.test_memory_agent_one_worker import AGENT, CONVERSATIONS, converse, memory_stack


def test_200_two_turn_conversations_all_continue_at_four_workers(start_servers):
    launcher = start_servers(memory_stack())
    assert launcher.instances[AGENT].num_workers == 4
    assert converse(launcher.instances) == [{"continued": True}] * CONVERSATIONS


def test_conversations_break_with_routing_switched_off(start_servers):
    launcher = start_servers(memory_stack(route_sessions=False))
    results = converse(launcher.instances)
    assert [result.get("error") for result in results if "error" in result] == []
    assert sum(result["continued"] for result in results) < CONVERSATIONS
