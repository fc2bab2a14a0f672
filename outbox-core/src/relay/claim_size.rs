//! How many events a worker asks for: the configured batch size, halved
//! after a claim the server cancelled (its statement timeout), doubled back
//! after a run of claims that went through. A claim that is too slow for
//! the statement timeout at full size (a large backlog behind blocked
//! aggregates on a loaded server) would otherwise time out at the same size
//! forever; a smaller one finishes and the relay keeps publishing.

/// Good claims in a row before the size doubles again.
pub(crate) const GROW_AFTER: u32 = 10;

/// A worker's claim size.
#[derive(Debug, Clone)]
pub(crate) struct ClaimSize {
    max: usize,
    current: usize,
    good: u32,
}

impl ClaimSize {
    /// Starts at `max` (the configured batch size, at least 1).
    pub(crate) fn new(max: usize) -> ClaimSize {
        let max = max.max(1);
        ClaimSize {
            max,
            current: max,
            good: 0,
        }
    }

    /// The number of events to ask for now.
    pub(crate) fn get(&self) -> usize {
        self.current
    }

    /// A claim was cancelled by the statement timeout: ask for half.
    pub(crate) fn timed_out(&mut self) {
        self.current = (self.current / 2).max(1);
        self.good = 0;
    }

    /// A claim went through; after [`GROW_AFTER`] in a row, ask for twice
    /// as many (up to the batch size).
    pub(crate) fn succeeded(&mut self) {
        if self.current == self.max {
            return;
        }
        self.good += 1;
        if self.good >= GROW_AFTER {
            self.current = (self.current * 2).min(self.max);
            self.good = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_timeouts_down_to_one_and_grows_back_after_a_run_of_good_claims() {
        let mut size = ClaimSize::new(100);
        size.timed_out();
        assert_eq!(size.get(), 50);
        for _ in 0..10 {
            size.timed_out();
        }
        assert_eq!(size.get(), 1, "never below one event");
        for _ in 0..GROW_AFTER - 1 {
            size.succeeded();
        }
        assert_eq!(size.get(), 1, "one good claim is not a run");
        size.succeeded();
        assert_eq!(size.get(), 2);
        for _ in 0..GROW_AFTER * 10 {
            size.succeeded();
        }
        assert_eq!(size.get(), 100, "back to the batch size, not beyond");
    }

    #[test]
    fn a_timeout_in_a_run_starts_the_run_again() {
        let mut size = ClaimSize::new(8);
        size.timed_out();
        for _ in 0..GROW_AFTER - 1 {
            size.succeeded();
        }
        size.timed_out();
        assert_eq!(size.get(), 2);
        for _ in 0..GROW_AFTER - 1 {
            size.succeeded();
        }
        assert_eq!(size.get(), 2);
    }
}
