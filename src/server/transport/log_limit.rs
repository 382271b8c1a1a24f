//! Log lines for what can repeat once per connection or per accept (a flood of idle
//! sockets, a full file table, refused sessions): at most one line per [`EVERY`] per
//! kind, the next one saying how many were left out. A flood costs counter increments,
//! not a line each (60 s of refused connections once wrote 1.3 GB of stderr).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest gap between two lines of one kind.
pub(super) const EVERY: Duration = Duration::from_secs(10);

/// One kind of repeated event.
#[derive(Debug)]
pub(super) struct Throttle {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    left_out: u64,
}

impl Throttle {
    pub(super) const fn new(every: Duration) -> Self {
        Throttle {
            every,
            state: Mutex::new(State {
                last: None,
                left_out: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be written now (`n`: how many events since the last
    /// line were not logged); `None` when this one is only counted.
    pub(super) fn ready(&self) -> Option<u64> {
        self.ready_at(Instant::now())
    }

    fn ready_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.last {
            Some(at) if now.saturating_duration_since(at) < self.every => {
                s.left_out += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.left_out))
            }
        }
    }
}

/// The tail of a throttled line: how many like it were left out.
pub(super) fn left_out(n: u64) -> String {
    match n {
        0 => String::new(),
        n => format!(" ({n} more like this since the last such line)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.ready_at(t0), Some(0));
        for i in 1..1000 {
            assert_eq!(t.ready_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(t.ready_at(t0 + Duration::from_secs(10)), Some(999));
        assert_eq!(t.ready_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(t.ready_at(t0 + Duration::from_secs(21)), Some(1));
        assert_eq!(left_out(0), "");
        assert!(left_out(3).contains("3 more"));
    }
}
