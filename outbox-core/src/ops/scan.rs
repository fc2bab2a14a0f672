//! Reading a consumer's letters a page at a time while keeping only those
//! of one failure (one [`error_fingerprint`]): what the CLI's
//! `--fingerprint` listings and repairs and the console's group pages and
//! group actions share. A fingerprint is computed from a letter's reason,
//! not stored, so a scan reads matching letters oldest first and keeps
//! those of the fingerprint, up to a bound on what it reads; it says where
//! it stopped, and a next scan goes on from there.

use std::future::Future;

use super::format::error_fingerprint;
use super::{LetterFilter, LetterRecord, Page};

/// The most letters a repair by fingerprint reads looking for its letters
/// (the CLI's and the console's).
pub const REPAIR_SCAN: usize = 100_000;

/// What [`scan_letters`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct LetterScan {
    /// The letters kept, oldest first.
    pub letters: Vec<LetterRecord>,
    /// The last letter read, when the scan stopped with more letters after
    /// it (the cursor to go on from); `None` when it read to the end.
    pub stopped_at: Option<i64>,
}

/// One page of a fingerprint's letters, as a listing shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FingerprintPage {
    /// Up to the page size of the fingerprint's letters, oldest first.
    pub letters: Vec<LetterRecord>,
    /// Where the next page starts (pass as `after`); `None` on the last.
    pub next: Option<i64>,
    /// The page read its whole bound of letters without filling up: its
    /// letters are all the fingerprint has among those read, and `next`
    /// goes on after the last one read.
    pub cut_short: bool,
}

/// Reads the letters matching `filter` from its `after` on, oldest first,
/// through `fetch` (a store's `letters`, one page of at most 1,000 a call),
/// keeping those whose reason has `fingerprint` (every one without), until
/// `want` are kept or `max_read` were read.
pub async fn scan_letters<F, Fut, E>(
    mut fetch: F,
    mut filter: LetterFilter,
    fingerprint: Option<&str>,
    want: usize,
    max_read: usize,
) -> Result<LetterScan, E>
where
    F: FnMut(LetterFilter) -> Fut,
    Fut: Future<Output = Result<Page<LetterRecord>, E>>,
{
    let mut letters = Vec::new();
    let mut read = 0;
    filter.limit = Some(1000);
    loop {
        let page = fetch(filter.clone()).await?;
        let count = page.items.len();
        for (index, letter) in page.items.into_iter().enumerate() {
            read += 1;
            let id = letter.id;
            if fingerprint.is_none_or(|f| error_fingerprint(&letter.reason) == f) {
                letters.push(letter);
            }
            if letters.len() >= want || read >= max_read {
                let more = if index + 1 < count {
                    true
                } else if page.next.is_some() {
                    // A full page: look whether anything follows it.
                    let probe = LetterFilter {
                        after: Some(id),
                        limit: Some(1),
                        ..filter.clone()
                    };
                    !fetch(probe).await?.items.is_empty()
                } else {
                    false
                };
                return Ok(LetterScan {
                    letters,
                    stopped_at: more.then_some(id),
                });
            }
        }
        match page.next {
            Some(next) => filter.after = Some(next),
            None => {
                return Ok(LetterScan {
                    letters,
                    stopped_at: None,
                });
            }
        }
    }
}

/// One page of `page_size` letters with `fingerprint` among those matching
/// `filter` (from its `after` on), reading at most `max_read` letters: the
/// page's `next` is its last letter when more of the fingerprint follow,
/// or the last letter read when the bound cut the page short.
pub async fn fingerprint_page<F, Fut, E>(
    fetch: F,
    filter: LetterFilter,
    fingerprint: &str,
    page_size: usize,
    max_read: usize,
) -> Result<FingerprintPage, E>
where
    F: FnMut(LetterFilter) -> Fut,
    Fut: Future<Output = Result<Page<LetterRecord>, E>>,
{
    let scan = scan_letters(fetch, filter, Some(fingerprint), page_size + 1, max_read).await?;
    let mut letters = scan.letters;
    if letters.len() > page_size {
        letters.truncate(page_size);
        let next = letters.last().map(|l| l.id);
        return Ok(FingerprintPage {
            letters,
            next,
            cut_short: false,
        });
    }
    let cut_short = scan.stopped_at.is_some() && letters.len() < page_size;
    Ok(FingerprintPage {
        letters,
        next: scan.stopped_at,
        cut_short,
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    fn letter(id: i64, reason: &str) -> LetterRecord {
        crate::ops::format::tests::letter(id, reason, 0)
    }

    /// Letters 1..=2500 of failure A, then 2501..=2630 of failure B (each
    /// with its own order number, one shape), served as a store serves
    /// them: keyset pages of at most `limit` after the cursor.
    fn letters() -> Vec<LetterRecord> {
        (1..=2630)
            .map(|id| {
                if id <= 2500 {
                    letter(id, "the ledger is closed")
                } else {
                    letter(id, &format!("refused the charge of order {id}"))
                }
            })
            .collect()
    }

    async fn serve(
        all: &[LetterRecord],
        filter: LetterFilter,
    ) -> Result<Page<LetterRecord>, Infallible> {
        let limit = filter.limit.unwrap_or(50) as usize;
        let items: Vec<LetterRecord> = all
            .iter()
            .filter(|l| filter.after.is_none_or(|after| l.id > after))
            .take(limit)
            .cloned()
            .collect();
        let next = (items.len() == limit).then(|| items.last().unwrap().id);
        Ok(Page { items, next })
    }

    #[tokio::test]
    async fn a_fingerprints_pages_go_on_past_a_bound_that_cut_one_short_and_end_at_its_last() {
        let all = letters();
        let refused = error_fingerprint("refused the charge of order 1");
        let mut filter = LetterFilter::default();
        let mut pages = Vec::new();
        loop {
            let page = fingerprint_page(|f| serve(&all, f), filter.clone(), &refused, 100, 1000)
                .await
                .unwrap();
            let ids: Vec<i64> = page.letters.iter().map(|l| l.id).collect();
            pages.push((ids.len(), page.cut_short));
            match page.next {
                Some(next) => filter.after = Some(next),
                None => break,
            }
            assert!(pages.len() < 10, "{pages:?}");
        }
        // Two bounds of 1,000 letters of A with none of B, then the last
        // 500 of A and 100 of B fill a page; then the rest.
        assert_eq!(pages, vec![(0, true), (0, true), (100, false), (30, false)]);
    }

    #[tokio::test]
    async fn a_page_that_fills_up_at_the_read_bound_is_not_cut_short() {
        // 900 of A, then 100 of B, then more of A: the 100th of B is the
        // 1,000th letter read.
        let all: Vec<LetterRecord> = (1..=1200)
            .map(|id| {
                if (901..=1000).contains(&id) {
                    letter(id, &format!("refused the charge of order {id}"))
                } else {
                    letter(id, "the ledger is closed")
                }
            })
            .collect();
        let refused = error_fingerprint("refused the charge of order 1");
        let page = fingerprint_page(
            |f| serve(&all, f),
            LetterFilter::default(),
            &refused,
            100,
            1000,
        )
        .await
        .unwrap();
        assert_eq!(page.letters.len(), 100);
        assert!(!page.cut_short, "a full page");
        assert_eq!(page.next, Some(1000), "goes on after the last one shown");
    }

    #[tokio::test]
    async fn a_scan_keeps_what_it_wants_and_says_whether_more_followed() {
        let all = letters();
        let ledger = error_fingerprint("the ledger is closed");
        let scan = scan_letters(
            |f| serve(&all, f),
            LetterFilter::default(),
            Some(&ledger),
            2500,
            10_000,
        )
        .await
        .unwrap();
        assert_eq!(scan.letters.len(), 2500);
        assert_eq!(scan.stopped_at, Some(2500), "letters of B follow");
        let everything = scan_letters(
            |f| serve(&all, f),
            LetterFilter::default(),
            None,
            usize::MAX,
            10_000,
        )
        .await
        .unwrap();
        assert_eq!(everything.letters.len(), 2630);
        assert_eq!(everything.stopped_at, None, "read to the end");
        let bounded = scan_letters(
            |f| serve(&all, f),
            LetterFilter::default(),
            None,
            usize::MAX,
            2000,
        )
        .await
        .unwrap();
        assert_eq!(bounded.letters.len(), 2000);
        assert_eq!(bounded.stopped_at, Some(2000));
    }
}
