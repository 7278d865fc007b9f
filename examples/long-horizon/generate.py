#!/usr/bin/env python3
"""Generates the long-horizon reference scenario and its data.

Run from this folder: `python3 generate.py`. The outputs (scenario.yaml, data/)
are committed; this script documents how they were made and remakes them the
same way (fixed seed).

The script is one for both runs (job.yaml with the context layers on,
baseline.yaml with them off): where the coordinator tries hands-on work, the
next step branches on what the history shows — denied: it delegates; it ran:
its output is in the main thread and it moves on. So every difference between
the two runs is the harness's doing.
"""
import json
import os
import random

random.seed(42)
ROUNDS = 20  # delegation rounds; 3 coordinator turns each, plus the hands-on blocks


def data():
    os.makedirs("data/logs", exist_ok=True)
    os.makedirs("data/sales", exist_ok=True)
    services = ["api", "billing", "auth", "search", "worker", "gateway"]
    levels = ["INFO"] * 8 + ["WARN"] * 2 + ["ERROR"]
    for n in range(1, 7):
        with open(f"data/logs/app-{n}.log", "w") as f:
            for i in range(1500):
                f.write(
                    f"2026-11-{n:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00Z {random.choice(levels):<5} "
                    f"{random.choice(services)} request_id={random.randrange(1 << 32):08x} latency_ms={random.randint(2, 1500)}\n"
                )
    for q in range(1, 5):
        with open(f"data/sales/2026-q{q}.csv", "w") as f:
            f.write("date,region,product,units,unit_price\n")
            for i in range(800):
                f.write(
                    f"2026-{(q - 1) * 3 + 1 + i % 3:02d}-{1 + i % 28:02d},{random.choice(['north', 'south', 'east', 'west'])},"
                    f"{random.choice(['widget', 'gadget', 'gizmo', 'sprocket'])},{random.randint(1, 40)},{random.randint(2, 90)}.{random.randint(0, 99):02d}\n"
                )


def agent(worker, text):
    return {"name": "Agent", "input": {"subagent_type": worker, "description": text[:40], "prompt": text}}


def todo(done, total):
    items = [{"content": f"analysis round {i + 1}", "status": "completed" if i < done else ("in_progress" if i == done else "pending")} for i in range(total)]
    return {"name": "TodoWrite", "input": {"todos": items[:8]}}


HANDS_ON = [
    # Each writes (tee, >) so it is never a glance; in the baseline it runs and its output lands in the main thread.
    "grep ERROR data/logs/app-1.log data/logs/app-2.log | tee .flower/artifacts/errors-1-2.txt",
    "sort -t, -k4 -n -r data/sales/2026-q1.csv | head -300 > /tmp/top.csv; cat /tmp/top.csv",
    "grep -h WARN data/logs/app-3.log data/logs/app-4.log | tee .flower/artifacts/warn-3-4.txt",
]


def mandate(i):
    log = f"data/logs/app-{i % 6 + 1}.log"
    return (
        f"Analyse {log}: ERROR counts per service and the slowest requests. "
        f"Workbench: .flower/ — full tables in .flower/artifacts/, reply with paths and conclusions only."
    )


def coordinator():
    steps = [{"id": "plan", "text": "Planning the analysis.", "tool_calls": [todo(0, ROUNDS)]}]
    steps.append({"id": "glance-data", "tool_calls": [{"name": "Bash", "input": {"command": "ls data data/logs | wc -l"}}]})
    k = 0
    for r in range(ROUNDS):
        if r in (1, 7, 14):
            cmd = HANDS_ON[k]
            steps.append({"id": f"hands-on-{k}", "text": "Quick look myself.", "tool_calls": [{"name": "Bash", "input": {"command": cmd}}]})
            steps.append({
                "id": f"after-hands-on-{k}",
                "text": "Noted.",
                "tool_calls": [todo(r, ROUNDS)],
                "branches": [{"when": {"denied": True}, "text": "Delegating that instead.", "tool_calls": [agent("analyst", f"Run this and keep the output in .flower/artifacts/: {cmd.split('|')[0].split('>')[0].strip()}. Workbench: .flower/; reply with the path and two lines of conclusions.")]}],
            })
            k += 1
        calls = [agent("analyst", mandate(2 * r))] if r == 0 else [agent("analyst", mandate(2 * r)), agent("analyst", mandate(2 * r + 1))]
        steps.append({"id": f"round-{r}", "text": f"Round {r + 1}.", "tool_calls": calls})
        steps.append({"id": f"track-{r}", "tool_calls": [todo(r + 1, ROUNDS)]})
        if r % 2 == 0:
            steps.append({"id": f"glance-{r}", "tool_calls": [{"name": "Bash", "input": {"command": "ls .flower/artifacts | wc -l"}}]})
        else:
            steps.append({"id": f"check-{r}", "tool_calls": [{"name": "Read", "input": {"file_path": ".flower/artifacts/summary.txt", "limit": 5}}]})
    steps.append({"id": "answer", "text": "Done: ERROR counts per service and the slowest requests are in .flower/artifacts/summary.txt; see the reports above."})
    return {"name": "coordinator", "match": {"system": "flower coordinator `conductor`"}, "steps": steps}


SCRIPT = """#!/bin/sh
# desc: per-service ERROR counts and the 40 slowest requests of every log under $1
for f in "$1"/*.log; do
  echo "== $f: ERROR lines per service"
  grep ERROR "$f" | awk '{print $3}' | sort | uniq -c | sort -rn
  echo "== $f: slowest requests"
  sort -t= -k3 -n -r "$f" | head -40
done
"""

REPORT = """**Conclusion**: the logs were analysed with .flower/scripts/summarize.sh; ERROR rates are even across services.
**Evidence**:
- data/logs/app-1.log:1 — first entry of the period
- .flower/artifacts/summary.txt:1 — per-service ERROR counts
- .flower/artifacts/summary.txt:9 — slowest requests
**Outputs**: .flower/artifacts/summary.txt
**Unverified / risks**: latency outliers were not cross-checked against deploys."""


def analyst():
    return {
        "name": "analyst",
        "match": {"system": "You are worker `analyst`"},
        "steps": [
            {"id": "look", "tool_calls": [{"name": "Bash", "input": {"command": "ls .flower/scripts/"}}]},
            {
                "id": "script",
                "tool_calls": [{"name": "Write", "input": {"file_path": ".flower/scripts/summarize.sh", "content": SCRIPT}}],
                "branches": [{"when": {"contains": "summarize.sh"}, "tool_calls": [{"name": "Bash", "input": {"command": "head -3 .flower/scripts/summarize.sh"}}]}],
            },
            {"id": "run", "tool_calls": [{"name": "Bash", "input": {"command": "sh .flower/scripts/summarize.sh data/logs"}}]},
            {"id": "grep", "tool_calls": [{"name": "Grep", "input": {"pattern": "ERROR", "path": "data/logs", "output_mode": "content", "head_limit": 150}}]},
            {"id": "save", "tool_calls": [{"name": "Bash", "input": {"command": "sh .flower/scripts/summarize.sh data/logs > .flower/artifacts/summary.txt && wc -l .flower/artifacts/summary.txt"}}]},
            {"id": "report", "text": REPORT},
        ],
    }


if __name__ == "__main__":
    data()
    scenario = {"model": "claude-sonnet-4-5", "roles": [coordinator(), analyst()]}
    with open("scenario.yaml", "w") as f:
        f.write("# Generated by generate.py (see there): the long-horizon reference scenario.\n")
        f.write(json.dumps(scenario, indent=1))  # JSON is YAML
        f.write("\n")
    print("coordinator steps:", len(scenario["roles"][0]["steps"]))
