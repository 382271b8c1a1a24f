//! The job store: ids, statuses, spooled output, long-poll, cancel, persistence;
//! shell jobs.
