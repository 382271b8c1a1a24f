//! Reading a job store: ranged reads and searches of spooled output, listing, and
//! pruning finished jobs.

use std::sync::Arc;

use super::excerpt::{make_excerpt, read_text};
use super::job::{Job, lock, now_unix_ms};
use super::persist::{parse_id, same_id};
use super::store::JobStore;
use super::{
    Excerpt, JobError, JobFilter, JobId, JobPage, JobSummary, OutputChunk, SearchHit, Stream,
    search,
};

impl JobStore {
    /// Read bytes `[offset, offset + len)` of a stream (at most `response_bytes`; the
    /// end never splits a character). `offset == total` gives an empty chunk (with
    /// `eof` once the job finished); `offset > total` is an error.
    pub fn read(
        &self,
        id: &str,
        stream: Stream,
        offset: u64,
        len: u64,
    ) -> Result<OutputChunk, JobError> {
        let job = self.get(id)?;
        let finished = job.is_finished();
        let (path, total) = {
            let spool = lock(&job.spools[stream.index()]);
            (spool.path().to_path_buf(), spool.len())
        };
        if offset > total {
            return Err(JobError::PastEnd {
                id: job.id.clone(),
                stream,
                offset,
                total,
                more: if finished {
                    ""
                } else {
                    " so far (it is still running)"
                },
            });
        }
        let len = len.min(self.cfg.response_bytes as u64);
        let (text, end, base64) = read_text(&path, offset, len, total)
            .map_err(|e| JobError::io(format!("could not read {stream} of job {}", job.id), e))?;
        Ok(OutputChunk {
            id: job.id.clone(),
            stream,
            offset,
            end,
            total,
            eof: finished && end == total,
            text,
            base64,
        })
    }

    /// An excerpt of bytes `[offset, end)` of a stream in about `budget` bytes of text
    /// (head and tail with the exact range left out), for an answer that must share its
    /// budget with other parts. Does not move the delivered cursors.
    pub fn excerpt(
        &self,
        id: &str,
        stream: Stream,
        offset: u64,
        end: u64,
        budget: usize,
    ) -> Result<Excerpt, JobError> {
        let job = self.get(id)?;
        let path = lock(&job.spools[stream.index()]).path().to_path_buf();
        make_excerpt(&path, offset, end, budget)
            .map_err(|e| JobError::io(format!("could not read {stream} of job {}", job.id), e))
    }

    /// Lines of a stream matching `pattern` (regex), with `context_lines` lines around
    /// each (at most 20), at most `max_hits` hits (1..=1000). Reads the spool
    /// sequentially without loading it. On a multi-threaded tokio runtime the scan runs
    /// under `block_in_place`, so a search of a large spool does not stall other tasks.
    pub fn search(
        &self,
        id: &str,
        stream: Stream,
        pattern: &str,
        context_lines: usize,
        max_hits: usize,
    ) -> Result<Vec<SearchHit>, JobError> {
        let limits = search::Limits {
            start: 0,
            context: context_lines,
            max_hits,
            text_budget: usize::MAX,
            count_cap: max_hits.clamp(1, search::MAX_HITS) as u64,
        };
        Ok(self.search_from(id, stream, pattern, &limits)?.hits)
    }

    /// A search from a cursor within limits: the hits, the count of all matches and
    /// where to continue (see [`search::scan`]).
    pub fn search_from(
        &self,
        id: &str,
        stream: Stream,
        pattern: &str,
        limits: &search::Limits,
    ) -> Result<search::Found, JobError> {
        let job = self.get(id)?;
        let re = search::compile(pattern).map_err(|reason| JobError::Pattern {
            pattern: pattern.into(),
            reason,
        })?;
        let (path, total) = {
            let spool = lock(&job.spools[stream.index()]);
            (spool.path().to_path_buf(), spool.len())
        };
        if limits.start > total {
            return Err(JobError::PastEnd {
                id: job.id.clone(),
                stream,
                offset: limits.start,
                total,
                more: "",
            });
        }
        let run = || search::scan(&path, total, &re, limits);
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let found = if on_worker {
            tokio::task::block_in_place(run)
        } else {
            run()
        };
        found.map_err(|e| JobError::io(format!("could not search {stream} of job {}", job.id), e))
    }

    /// Jobs matching `filter`, newest first.
    pub fn list(&self, filter: &JobFilter) -> Vec<JobSummary> {
        let jobs: Vec<Arc<Job>> = self.jobs().map.values().rev().cloned().collect();
        let now = now_unix_ms();
        let mut out = Vec::new();
        for job in jobs {
            if filter.limit.is_some_and(|l| out.len() >= l) {
                break;
            }
            let summary = job.summary();
            if matches(filter, &summary, now) {
                out.push(summary);
            }
        }
        out
    }

    /// One page of the jobs matching `filter`, newest first, starting after `cursor` (a
    /// job id from the previous page's `next_cursor`): at most `max_jobs`, and no more than
    /// fit in about `budget` bytes of response (each listed job is shown as a text line
    /// and as structured data). Walks the table without copying it.
    pub fn list_page(
        &self,
        filter: &JobFilter,
        cursor: Option<&str>,
        max_jobs: usize,
        budget: usize,
    ) -> Result<JobPage, JobError> {
        let before = match cursor {
            None => u64::MAX,
            Some(c) => parse_id(c).ok_or_else(|| {
                JobError::Request(format!(
                    "cursor {c:?} is not a job id; pass the next_cursor of the previous page"
                ))
            })?,
        };
        let now = now_unix_ms();
        let jobs = self.jobs();
        let mut out: Vec<JobSummary> = Vec::new();
        let mut used = 0usize;
        let mut next_cursor = None;
        for job in jobs.map.range(..before).rev().map(|(_, j)| j) {
            let summary = job.summary();
            if !matches(filter, &summary, now) {
                continue;
            }
            // The text line and the JSON object: about twice the label plus the fields.
            let cost =
                2 * (summary.label.len() + summary.session.as_ref().map_or(0, String::len)) + 300;
            if out.len() >= max_jobs.max(1) || (!out.is_empty() && used + cost > budget) {
                next_cursor = out.last().map(|s| s.id.clone());
                break;
            }
            used += cost;
            out.push(summary);
        }
        Ok(JobPage {
            jobs: out,
            next_cursor,
        })
    }

    /// Summary of one job.
    pub fn summary(&self, id: &str) -> Result<JobSummary, JobError> {
        Ok(self.get(id)?.summary())
    }

    /// Remove finished jobs matching `filter` and their files; returns their ids
    /// (oldest first). Running jobs are never pruned.
    pub fn prune(&self, filter: &JobFilter) -> Result<Vec<JobId>, JobError> {
        let now = now_unix_ms();
        let removed: Vec<Arc<Job>> = {
            let mut jobs = self.jobs();
            let mut picked: Vec<u64> = Vec::new();
            for (seq, job) in jobs.map.iter().rev() {
                if filter.limit.is_some_and(|l| picked.len() >= l) {
                    break;
                }
                let summary = job.summary();
                if summary.status.is_finished() && matches(filter, &summary, now) {
                    picked.push(*seq);
                }
            }
            picked
                .iter()
                .rev()
                .filter_map(|seq| jobs.map.remove(seq))
                .collect()
        };
        for job in &removed {
            self.forget_files(job);
        }
        Ok(removed.iter().map(|j| j.id.clone()).collect())
    }
}

fn matches(filter: &JobFilter, s: &JobSummary, now_ms: u64) -> bool {
    filter.status.as_ref().is_none_or(|v| v.contains(&s.status))
        && filter.kind.as_ref().is_none_or(|v| v.contains(&s.kind))
        && filter
            .session
            .as_ref()
            .is_none_or(|want| s.session.as_deref() == Some(want.as_str()))
        && filter
            .ids
            .as_ref()
            .is_none_or(|ids| ids.iter().any(|i| same_id(i, &s.id)))
        && filter
            .older_than_secs
            .is_none_or(|secs| now_ms.saturating_sub(s.created_unix_ms) >= secs * 1000)
}
