"""The background job manager: debounce, newest wins, stale results dropped, progress in try/finally."""

from __future__ import annotations

import threading

import pytest

from kernel_lsp.services.jobs import JobKey, JobManager

KEY = JobKey("file:///a.cu", "compile")


@pytest.fixture
def jobs():
    manager = JobManager(max_workers=4)
    yield manager
    manager.shutdown()


def test_result_is_published_when_version_matches(jobs: JobManager) -> None:
    published = []
    outcome = jobs.submit(KEY, lambda ctx: ctx.version * 10, publish=published.append, version=3,
                          current_version=lambda: 3).result(5)
    assert outcome.state == "published" and published == [30]


def test_stale_result_is_not_published(jobs: JobManager) -> None:
    published, outcomes = [], []
    jobs.submit(KEY, lambda ctx: "old", publish=published.append, version=3, current_version=lambda: 4,
                on_done=outcomes.append).result(5)
    assert published == [] and [o.state for o in outcomes] == ["stale"]


def test_newer_job_cancels_older_during_debounce(jobs: JobManager) -> None:
    ran, published = [], []
    first = jobs.submit(KEY, lambda ctx: ran.append("first"), publish=published.append, delay_s=5.0)
    second = jobs.submit(KEY, lambda ctx: ran.append("second") or "second", publish=published.append)
    assert first.result(5).state == "cancelled"  # ended at once, not after 5 s
    assert second.result(5).state == "published"
    assert ran == ["second"] and published == ["second"]


def test_newer_job_sets_the_running_jobs_cancel_event(jobs: JobManager) -> None:
    started = threading.Event()
    seen_cancel = []

    def slow(ctx):
        started.set()
        seen_cancel.append(ctx.cancel.wait(5.0))  # what proc.run polls
        return "slow"

    published = []
    first = jobs.submit(KEY, slow, publish=published.append)
    assert started.wait(5)
    jobs.submit(KEY, lambda ctx: "fast", publish=published.append).result(5)
    assert first.result(5).state == "cancelled"
    assert seen_cancel == [True] and published == ["fast"]


def test_different_keys_do_not_cancel_each_other(jobs: JobManager) -> None:
    other = JobKey("file:///a.cu", "profile", kernel="k")
    a = jobs.submit(KEY, lambda ctx: 1, publish=lambda r: None, delay_s=0.05)
    b = jobs.submit(other, lambda ctx: 2, publish=lambda r: None, delay_s=0.05)
    assert a.result(5).state == b.result(5).state == "published"


def test_cancel_uri_cancels_all_jobs_of_a_document(jobs: JobManager) -> None:
    futures = [jobs.submit(JobKey("file:///a.cu", kind), lambda ctx: 1, publish=lambda r: None, delay_s=5.0)
               for kind in ("compile", "profile")]
    keep = jobs.submit(JobKey("file:///b.cu", "compile"), lambda ctx: 1, publish=lambda r: None, delay_s=0.05)
    assert jobs.cancel_uri("file:///a.cu") == 2
    assert [f.result(5).state for f in futures] == ["cancelled", "cancelled"]
    assert keep.result(5).state == "published"


def test_failure_is_an_outcome_and_progress_always_ends(jobs: JobManager) -> None:
    events = []

    class Sink:
        def begin(self, title, message=None):
            events.append(("begin", title))

        def report(self, message=None, percentage=None):
            events.append(("report", message))

        def end(self, message=None):
            events.append(("end", message))

    def work(ctx):
        ctx.report("half", 50)
        raise ValueError("boom")

    outcome = jobs.submit(KEY, work, publish=lambda r: None, title="nvcc", progress=Sink).result(5)
    assert outcome.state == "failed" and "boom" in outcome.error
    assert events == [("begin", "nvcc"), ("report", "half"), ("end", None)]


def test_post_decides_where_results_are_delivered() -> None:
    posted = []
    manager = JobManager(post=posted.append)
    try:
        published = []
        manager.submit(KEY, lambda ctx: 7, publish=published.append).result(5)
        assert published == [] and len(posted) == 1  # nothing delivered until the owner runs it
        posted[0]()
        assert published == [7]
    finally:
        manager.shutdown()
