//! The fault schedule's random numbers: SplitMix64, so a printed seed
//! replays the same choices.

/// A small deterministic generator: the same seed, the same schedule.
#[derive(Debug, Clone)]
pub struct Schedule(u64);

impl Schedule {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Schedule {
        Schedule(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// The seed from `OUTBOX_FAULT_SEED`, or one from the clock.
    pub fn seed_from_env() -> u64 {
        std::env::var("OUTBOX_FAULT_SEED")
            .ok()
            .map(|s| s.parse().expect("OUTBOX_FAULT_SEED is a number"))
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("a clock after 1970")
                    .as_nanos() as u64
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_numbers() {
        let mut a = Schedule::new(42);
        let mut b = Schedule::new(42);
        let first: Vec<u64> = (0..5).map(|_| a.below(1_000)).collect();
        assert_eq!(first, (0..5).map(|_| b.below(1_000)).collect::<Vec<_>>());
        assert_ne!(first, {
            let mut c = Schedule::new(43);
            (0..5).map(|_| c.below(1_000)).collect::<Vec<_>>()
        });
    }
}
