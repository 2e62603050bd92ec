//! Paced updates: each version written once the one before reached every subscriber (or its
//! `--update-timeout` passed), `--update-gap` apart; the propagation of each.

use crate::GIVE_UP_AFTER;
use crate::args::Args;
use crate::load::Tracker;
use crate::sampling::ms;
use crate::sources::Sources;

/// What the paced updates measured.
#[derive(Debug, Default)]
pub(crate) struct Paced {
    /// From the write until every subscriber has it, per update that reached them all (ms).
    pub(crate) propagation: Vec<f64>,
    /// Updates written.
    pub(crate) applied: u64,
    /// Updates that did not reach every subscriber: timed out, or not written after a stop.
    pub(crate) incomplete: u64,
    /// Why the updates stopped before the last, in words.
    pub(crate) stopped: Option<String>,
}

/// One update written: its version, when it was written and when every subscriber had it
/// (`None`: not within the timeout), on the tracker's clock.
pub(crate) struct Written {
    pub(crate) seq: u64,
    pub(crate) at: u64,
    pub(crate) reached: Option<u64>,
}

/// Writes versions 1 to `--updates`, each once the one before reached every subscriber, calling
/// `each` after each; stops early when `exited` has a note (the proxy is gone) or when
/// [`GIVE_UP_AFTER`] in a row did not reach everyone.
pub(crate) async fn paced(
    args: &Args,
    sources: &Sources,
    tracker: &Tracker,
    mut exited: impl FnMut() -> Option<String>,
    mut each: impl FnMut(&Written),
) -> anyhow::Result<Paced> {
    let mut paced = Paced::default();
    let mut missed_in_a_row = 0;
    for seq in 1..=args.updates {
        if let Some(note) = stop(args.updates - seq + 1, missed_in_a_row, &mut exited) {
            paced.incomplete += args.updates - seq + 1;
            paced.stopped = Some(note);
            break;
        }
        let (at, reached) = sources.deliver(seq, tracker, args.update_timeout).await?;
        paced.applied += 1;
        if let Some(reached) = reached {
            missed_in_a_row = 0;
            paced.propagation.push(ms(reached - at));
        } else {
            missed_in_a_row += 1;
            paced.incomplete += 1;
        }
        each(&Written { seq, at, reached });
        tokio::time::sleep(args.update_gap).await;
    }
    Ok(paced)
}

/// Why the updates stop with `left` still to write, if they do.
fn stop(
    left: u64,
    missed_in_a_row: u64,
    exited: &mut impl FnMut() -> Option<String>,
) -> Option<String> {
    if let Some(note) = exited() {
        return Some(format!(
            "paced updates: the other {left} were not written: {note}"
        ));
    }
    (missed_in_a_row == GIVE_UP_AFTER).then(|| {
        format!(
            "paced updates: {GIVE_UP_AFTER} in a row did not reach every subscriber; the other {left} were not written and count as not delivered"
        )
    })
}
