"""The counter /run end-to-end test of session routing, through the legacy relay: counter at 4 workers."""

from __future__ import annotations

from tests.e2e.test_legacy_relay_one_worker import COUNTER, EPISODES, counter_behind_relay, run_through_relay


def test_run_episodes_through_the_relay_all_score_with_the_counter_at_four_workers(start_servers):
    launcher = start_servers(counter_behind_relay(num_workers=4))
    assert (launcher.instances[COUNTER].num_workers, launcher.instances["legacy_agent"].num_workers) == (4, 1)
    results = run_through_relay(launcher.instances)
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, [r.get("error") for r in results if "error" in r][:3]


def test_run_episodes_through_the_relay_lose_rewards_with_routing_switched_off(start_servers):
    launcher = start_servers(counter_behind_relay(num_workers=4, route_sessions=False))
    results = run_through_relay(launcher.instances)
    assert sum(result["reward"] == 1.0 for result in results) < EPISODES
