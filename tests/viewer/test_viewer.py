"""The run viewer, ``python -m benchmarks.view``: its pages in a real headless Chromium, against real runs.

The runs are made with ``benchmarks.run_benchmark`` on the local backend: a replay agent over three
tasks (one solved, one whose actions print HTML and script, one the replay file has no actions for:
an agent error), and the llm agent against the chat stand-in (``chat_server``) as a hostile model
whose message and action carry markup. The viewer runs as its command line does, in a subprocess.
The browser is Debian's chromium with its chromedriver; where they or selenium are missing the
tests skip, except under CI (``CI`` or ``SNAPGYM_REQUIRE_ALL=1``), which must have them.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import benchmarks
from benchmarks import view
from benchmarks.episodes.recording.ledger import RESULT, read_records
from benchmarks.viewer import RunReader
from tests.support.needs import skip_missing
from tests.support.servers.chat_server import ChatRequest, ChatServer

REPO = Path(__file__).resolve().parents[2]
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SOLVE = "awk '$9 ~ /^5/' /app/access.log | wc -l > /app/answer.txt"
"""Solves log-error-count."""
IMG = """<img src=x onerror="document.title='pwned'">"""
SCRIPT = "<script>document.title='pwned by script'</script>"
HOSTILE = f"cat <<'EOF'\n{IMG}\n{SCRIPT}\nEOF"
"""An action whose text, and output, is markup that would run if a page parsed it as HTML."""
HOSTILE_REPLY = f"Let me look {IMG} {SCRIPT}\n```bash\n{HOSTILE}\n```"
HOSTILE_DIFF = {
    "source": "host", "added": [f"/app/{IMG}", "/app/new/"], "changed": ["/app/top_ips.txt"], "removed": [],
    "counts": {"added": 2, "changed": 1, "removed": 0}, "truncated": False,
}  # fmt: skip
WAIT_S = 30.0


# -- the browser --------------------------------------------------------------------


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if chromium() is None or not CHROMEDRIVER.is_file():
        return "chromium and its driver are not installed (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium driven through /usr/bin/chromedriver (never Selenium Manager: no internet)."""
    missing = browser_missing()
    if missing:
        skip_missing(missing, required=True if os.environ.get("CI") else None)  # CI must run the browser tests
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium())
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,2000"):
        options.add_argument(argument)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, f"waited {WAIT_S} s for {what}")


def texts(driver: Any, selector: str) -> list[str]:
    """The text of every element ``selector`` matches, read at one moment (the page may re-render)."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent)"
    return list(driver.execute_script(script, selector))


def table_tasks(driver: Any) -> list[str]:
    return texts(driver, "#episodes tbody tr td:first-child")


def open_episode(driver: Any, url: str, episode_id: str) -> None:
    driver.get(f"{url}episode?id={episode_id}")
    wait_for(driver, lambda d: d.find_element("id", "episode").is_displayed(), f"episode {episode_id} to render")


def fetches(driver: Any, path: str) -> int:
    """How many times the open page has requested ``path``."""
    script = "return performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname == arguments[0])"
    script += ".length"
    return int(driver.execute_script(script, path))


def no_page_errors(driver: Any) -> None:
    """Nothing the page did failed: no script error, no resource or CSP refusal in the console."""
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, severe


# -- runs and viewers ---------------------------------------------------------------


def run(store: Path, run_dir: Path, *overrides: str) -> Path:
    benchmarks.run_benchmark(*overrides, "progress=false", f"backend.store_dir={store}", f"output_dir={run_dir}")
    return run_dir


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("viewer-store")


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Path:
    """Replay: log-error-count solved (two steps), top-ips printing markup (reward 0), json-merge-users
    without actions (an agent error); then top-ips's end-state diff replaced by one with markup in a
    path, and json-merge-users's by what a cloud backend writes."""
    root = tmp_path_factory.mktemp("mixed")
    script = root / "actions.jsonl"
    lines = [("log-error-count", "printf 'line one\\nline two\\n'"), ("log-error-count", SOLVE), ("top-ips", HOSTILE)]
    script.write_text("".join(json.dumps({"task_id": task, "action": action}) + "\n" for task, action in lines))
    run_dir = run(store, root / "run", "agent=replay", f"agent.path={script}",
                  "suite.include=[log-error-count,top-ips,json-merge-users]")  # fmt: skip
    episodes = run_dir / "episodes"
    (episodes / "top-ips/0-1/diff.json").write_text(json.dumps(HOSTILE_DIFF))
    unavailable = {"unavailable": "the e2b backend cannot list them outside the sandbox"}  # as a cloud run writes
    (episodes / "json-merge-users/0-1/diff.json").write_text(json.dumps(unavailable))
    connection = {"phase": "agent", "kind": "connect", "host": IMG, "port": 443, "verdict": "denied",
                  "rule": "no-network", "bytes_up": 0, "bytes_down": 0, "error": None}  # fmt: skip
    (episodes / "top-ips/0-1/network.json").write_text(json.dumps({"connections": [connection], "dropped": 0}))
    return run_dir


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Path:
    """The llm agent on log-error-count against a stand-in model: a hostile reply, the solution, submit."""

    def reply(request: ChatRequest) -> str:
        turn = sum(message.get("role") == "assistant" for message in request.messages)
        return [HOSTILE_REPLY, f"```bash\n{SOLVE}\n```", "submit"][min(turn, 2)]

    server = ChatServer(reply)
    server.start()
    try:
        agent = ["agent=llm", f"agent.base_url={server.base_url}", "agent.model=scripted", "agent.api_key_env=''"]
        return run(store, tmp_path_factory.mktemp("llm") / "run", *agent, "suite.include=[log-error-count]")
    finally:
        server.close()


@contextmanager
def viewer(run_dir: Path) -> Iterator[str]:
    """``python -m benchmarks.view RUN_DIR --port 0`` in a subprocess; yields the URL it prints."""
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "benchmarks.view", str(run_dir), "--port", "0"], cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)  # fmt: skip
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            found = re.search(r"http://127\.0\.0\.1:\d+/", line)
            if not found:
                stderr.seek(0)
                raise AssertionError(f"the viewer printed {line!r}; its stderr: {stderr.read()[-3000:]}")
            yield found.group(0)
        finally:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def mixed_url(mixed_run: Path) -> Iterator[str]:
    with viewer(mixed_run) as url:
        yield url


@pytest.fixture(scope="module")
def llm_url(llm_run: Path) -> Iterator[str]:
    with viewer(llm_run) as url:
        yield url


def trajectory_of(run_dir: Path, task: str) -> dict[str, Any]:
    return dict(json.loads((run_dir / f"episodes/{task}/0-1/agent/trajectory.json").read_text()))


def agent_steps(trajectory: dict[str, Any]) -> list[tuple[str, str]]:
    """(action, output) of each agent step, as the trajectory file holds them."""
    pairs = []
    for step in trajectory["steps"][1:]:
        call = step["tool_calls"][0]
        pairs.append((call["arguments"].get("command", call["function_name"]),
                      step["observation"]["results"][0]["content"]))  # fmt: skip
    return pairs


def check_episode_page(driver: Any, run_dir: Path, task: str) -> None:
    """The open episode page shows the instruction, every step's action and output, the verifier's output."""
    trajectory = trajectory_of(run_dir, task)
    assert texts(driver, "#instruction") == [trajectory["steps"][0]["message"]]
    assert list(zip(texts(driver, ".step .action"), texts(driver, ".step .output"), strict=True)) == agent_steps(
        trajectory
    )
    verifier = (run_dir / f"episodes/{task}/0-1/verifier/test-stdout.txt").read_text()
    assert texts(driver, "#verifier-output") == [verifier or "(empty)"]


# -- the index page -----------------------------------------------------------------


def test_the_table_lists_every_episode_with_its_outcome_and_reward(browser: Any, mixed_url: str) -> None:
    browser.get(mixed_url)
    wait_for(browser, lambda d: len(table_tasks(d)) == 3, "three rows")
    rows = [texts(browser, f"#episodes tbody tr:nth-child({n}) td") for n in (1, 2, 3)]
    assert [row[:5] for row in rows] == [
        ["json-merge-users", "0", "1", "agent_error", "\N{EN DASH}"],
        ["log-error-count", "0", "1", "scored", "1.000"],
        ["top-ips", "0", "1", "scored", "0.000"],
    ]
    assert rows[1][6] == "2"  # steps: the printf and the solution (submit is not counted)
    assert "finished" in texts(browser, "#state")[0]
    assert "mean reward" in texts(browser, "#counts dt") and "0.333" in texts(browser, "#counts dd")
    plots = browser.find_elements("css selector", "#plots img")
    assert {"reward_by_task.png", "reset_latency.png"} <= {img.get_attribute("alt") for img in plots}
    wait_for(browser, lambda d: all(img.get_property("naturalWidth") > 0 for img in plots), "the plots to load")
    for img in plots:  # drawn at the image's own aspect ratio, never stretched
        natural = img.get_property("naturalWidth") / img.get_property("naturalHeight")
        drawn = img.get_property("width") / img.get_property("height")
        assert abs(drawn - natural) < 0.02 * natural, img.get_attribute("alt")
    table, section = (browser.find_element("css selector", css) for css in ("#episodes", "#plots-section"))
    assert section.location["y"] > table.location["y"]  # the plots come below the episode table
    no_page_errors(browser)


def test_the_text_and_outcome_filters_narrow_the_table(browser: Any, mixed_url: str) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(mixed_url)
    wait_for(browser, lambda d: len(table_tasks(d)) == 3, "three rows")
    search = browser.find_element("id", "filter")
    search.send_keys("scored")
    assert table_tasks(browser) == ["log-error-count", "top-ips"]
    search.send_keys(" TOP")  # every word, any case
    assert table_tasks(browser) == ["top-ips"]
    assert texts(browser, "#shown") == ["1 of 3 episodes"]
    search.clear()
    outcome = Select(browser.find_element("id", "outcome"))
    outcome.select_by_value("agent_error")
    assert table_tasks(browser) == ["json-merge-users"]
    outcome.select_by_value(":passed")
    assert table_tasks(browser) == ["log-error-count"]
    outcome.select_by_value(":failed")
    assert table_tasks(browser) == ["json-merge-users", "top-ips"]
    search.send_keys("replay file")  # the agent error's message
    assert table_tasks(browser) == ["json-merge-users"]


# -- the episode page ---------------------------------------------------------------


def test_an_episode_page_shows_instruction_steps_outputs_verifier_and_diff(
    browser: Any, mixed_url: str, mixed_run: Path
) -> None:
    browser.get(mixed_url)
    wait_for(browser, lambda d: len(table_tasks(d)) == 3, "three rows")
    browser.find_element("link text", "log-error-count").click()
    wait_for(browser, lambda d: d.find_element("id", "episode").is_displayed(), "the episode page")
    check_episode_page(browser, mixed_run, "log-error-count")
    assert texts(browser, ".step .output")[0] == "line one\nline two\n[exit code 0]"
    assert texts(browser, "#diff ul.added li") == ["/app/answer.txt"]  # the runner's own diff.json
    assert "reward" in texts(browser, "#verdict dt") and "strict" in texts(browser, "#verdict dd")
    assert "episodes/log-error-count/0-1/verifier/test-stdout.txt" in texts(browser, "#files a")
    no_page_errors(browser)
    open_episode(browser, mixed_url, "json-merge-users:0")
    assert "the replay file has no actions for task json-merge-users" in texts(browser, "#error")[0]
    unavailable = "end-state diff unavailable: the e2b backend cannot list them outside the sandbox"
    assert texts(browser, "#diff") == [unavailable]


def test_a_model_agents_steps_show_its_message_model_and_tokens(browser: Any, llm_run: Path, llm_url: str) -> None:
    browser.get(llm_url)
    wait_for(browser, lambda d: table_tasks(d) == ["log-error-count"], "the row")
    assert texts(browser, "#episodes tbody td")[-1] == "45"  # three turns of 10 + 5 tokens
    open_episode(browser, llm_url, "log-error-count:0")
    check_episode_page(browser, llm_run, "log-error-count")
    assert texts(browser, ".step .message")[0] == HOSTILE_REPLY
    assert texts(browser, ".step .label")[0] == "model (scripted)"
    assert texts(browser, ".step .tokens")[0] == "tokens: prompt tokens 10, completion tokens 5"


def test_text_the_agent_wrote_shows_literally_and_never_runs(browser: Any, mixed_url: str, llm_url: str) -> None:
    """Markup in an action, its output, a model message, a file name and a host name is text."""
    open_episode(browser, mixed_url, "top-ips:0")
    shown = {
        "action": texts(browser, ".step .action")[0],
        "output": texts(browser, ".step .output")[0],
        "diff": texts(browser, "#diff ul.added li")[0],
        "host": texts(browser, "#network td")[2],
    }
    assert shown == {"action": HOSTILE, "output": f"{IMG}\n{SCRIPT}\n[exit code 0]", "diff": f"/app/{IMG}",
                     "host": IMG}  # fmt: skip
    nothing_ran(browser, "top-ips:0")
    open_episode(browser, llm_url, "log-error-count:0")
    assert texts(browser, ".step .message")[0] == HOSTILE_REPLY
    nothing_ran(browser, "log-error-count:0")


def nothing_ran(driver: Any, episode_id: str) -> None:
    """No handler or script of the agent's ran, and its text made no element."""
    time.sleep(0.5)  # an onerror handler would have run by now
    assert driver.title == f"snapgym episode {episode_id}"
    assert not driver.find_elements("css selector", "img, script:not([src])")
    holders = "pre, ul.paths li, td, dd"  # where text is shown: only the table's links are elements there
    script = "return Array.from(document.querySelectorAll(arguments[0])).filter(e => e.querySelector(':not(a)'))"
    assert not driver.execute_script(script + ".length", holders), "agent text became elements"
    no_page_errors(driver)


# -- the file endpoint and the command line -------------------------------------------


def get(url: str, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """A GET of ``path`` exactly as written (no client-side normalisation of ``..``)."""
    address = url.removeprefix("http://").rstrip("/")
    connection = http.client.HTTPConnection(address, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_the_file_endpoint_serves_only_the_run_directorys_files(mixed_run: Path, mixed_url: str) -> None:
    outside = mixed_run.parent / "secret.txt"
    outside.write_text("not for the viewer")
    hazards = [mixed_run / "link-out.txt", mixed_run / "dir-out", mixed_run / "pipe.txt"]
    hazards[0].symlink_to(outside)
    hazards[1].symlink_to(mixed_run.parent)
    os.mkfifo(hazards[2])
    try:
        check_the_file_endpoint(mixed_run, mixed_url)
    finally:
        for hazard in hazards:
            hazard.unlink()


def check_the_file_endpoint(mixed_run: Path, mixed_url: str) -> None:
    status, headers, body = get(mixed_url, "/files/episodes/top-ips/0-1/agent/trajectory.json")
    assert status == 200 and body == (mixed_run / "episodes/top-ips/0-1/agent/trajectory.json").read_bytes()
    assert headers["content-type"] == "text/plain; charset=utf-8" and headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in headers["content-security-policy"]
    refused = ["/files/../secret.txt", "/files/%2e%2e/secret.txt", "/files/episodes/../../secret.txt",
               "/files//etc/passwd", "/files/%2Fetc%2Fpasswd", "/files/link-out.txt", "/files/dir-out/secret.txt",
               "/files/pipe.txt", "/files/episodes"]  # fmt: skip
    for path in refused:
        status, _, body = get(mixed_url, path)
        assert status == 403 and b"not for the viewer" not in body, (path, status, body)
    assert get(mixed_url, "/files/no-such-file.txt")[0] == 404
    assert get(mixed_url, "/files/episodes.parquet")[1]["content-disposition"] == "attachment"
    status, headers, _ = get(mixed_url, "/")
    assert status == 200 and "default-src 'none'" in headers["content-security-policy"]
    assert "script-src 'self'" in headers["content-security-policy"]
    assert get(mixed_url, "/api/run", host="attacker.example")[0] == 421  # DNS rebinding


def test_a_path_that_is_not_a_run_directory_exits_2_naming_the_problem(
    tmp_path: Path, mixed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.view", str(tmp_path / "missing")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and f"{tmp_path / 'missing'} does not exist" in done.stderr, done.stderr
    holder = tmp_path / "runs"
    shutil.copytree(mixed_run, holder / "one", symlinks=True)
    cases = {
        holder / "one" / "episodes": "is not a run directory (it has neither ledger.jsonl nor run.yaml)",
        holder: f"holds runs; view one of them: {holder / 'one'}",
    }
    for path, message in cases.items():
        with pytest.raises(SystemExit) as exit:
            view.main([str(path)])
        assert exit.value.code == 2 and message in capsys.readouterr().err


def test_the_run_state_follows_the_summary_and_the_ledger(tmp_path: Path, mixed_run: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(mixed_run, run_dir)  # new times: the ledger may now look newer than the summary
    later = time.time() + 5
    os.utime(run_dir / "ledger.jsonl", (later, later))
    assert RunReader(run_dir).run()["state"] == "finished"
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["counts"]["infra_error"] = 1
    (run_dir / "summary.json").write_text(json.dumps(summary))
    state = RunReader(run_dir).run()
    assert state["state"] == "incomplete" and state["live"] and f"resume={run_dir}" in state["detail"]
    with (run_dir / "ledger.jsonl").open("a") as ledger:  # a resume starts playing an episode again
        ledger.write(json.dumps({"kind": "attempt", "episode_id": "top-ips:0", "attempt": 2}) + "\n")
    os.utime(run_dir / "ledger.jsonl", (later, later))
    assert RunReader(run_dir).run()["state"] == "in_progress"


# -- the live view ------------------------------------------------------------------


def test_the_page_follows_a_run_in_progress_and_stops_when_it_finishes(
    browser: Any, tmp_path: Path, mixed_run: Path
) -> None:
    records = list(read_records(mixed_run / "ledger.jsonl"))
    starts = [json.dumps(r) + "\n" for r in records if r["kind"] != RESULT]
    results = [json.dumps(r) + "\n" for r in records if r["kind"] == RESULT]
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(mixed_run / "run.yaml", live)
    shutil.copytree(mixed_run / "episodes", live / "episodes")
    ledger = live / "ledger.jsonl"
    ledger.write_text("".join(starts) + results[0])
    with viewer(live) as url:
        browser.get(url)
        wait_for(browser, lambda d: len(table_tasks(d)) == 1, "the first row")
        assert "in progress" in texts(browser, "#state")[0]
        browser.execute_script("window.notReloaded = true; performance.setResourceTimingBufferSize(100000);")
        with ledger.open("a") as file:  # a record being written: half a line, then the rest
            file.write(results[1][:40])
            file.flush()
            read = fetches(browser, "/api/episodes")
            wait_for(browser, lambda d: fetches(d, "/api/episodes") > read, "the page to read the torn ledger")
            assert len(table_tasks(browser)) == 1
            file.write(results[1][40:])
        wait_for(browser, lambda d: len(table_tasks(d)) == 2, "the second row")
        assert "in progress" in texts(browser, "#state")[0]
        with ledger.open("a") as file:  # the last result, then the summary: the run has finished
            file.write(results[2])
        shutil.copy(mixed_run / "summary.json", live)
        wait_for(browser, lambda d: "finished" in texts(d, "#state")[0], "the run to show as finished")
        assert len(table_tasks(browser)) == 3
        assert browser.execute_script("return window.notReloaded === true")
        polls = fetches(browser, "/api/run")
        time.sleep(2.5)  # longer than a poll's interval
        assert fetches(browser, "/api/run") == polls, "the page kept polling a finished run"
    no_page_errors(browser)


# -- a whole suite ------------------------------------------------------------------


def test_every_episode_of_a_21_task_run_shows_its_steps_and_verifier_output(
    browser: Any, tmp_path: Path, store: Path
) -> None:
    run_dir = run(store, tmp_path / "run")
    tasks = sorted(json.loads((run_dir / "summary.json").read_text())["by_task"])
    assert len(tasks) == 21
    with viewer(run_dir) as url:
        browser.get(url)
        wait_for(browser, lambda d: table_tasks(d) == tasks, "every episode in the table")
        for task in tasks:
            open_episode(browser, url, f"{task}:0")
            check_episode_page(browser, run_dir, task)
            assert texts(browser, ".step .action")[-1] == "submit"
    no_page_errors(browser)
