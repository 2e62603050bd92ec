//! Where a request goes: which connection, or whether to wait for room, or to open another.
use http::Request;

/// The requests in flight on one connection (responses, body included, not finished).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Load {
    /// Watches (`watch=true`): they stay open for minutes.
    pub watches: usize,
    /// Everything else (lists, gets, reviews, events): they end within moments.
    pub shorts: usize,
}

impl Load {
    pub fn total(self) -> usize {
        self.watches + self.shorts
    }

    pub fn add(&mut self, lifetime: Lifetime) {
        match lifetime {
            Lifetime::Watch => self.watches += 1,
            Lifetime::Short => self.shorts += 1,
        }
    }

    pub fn remove(&mut self, lifetime: Lifetime) {
        let count = match lifetime {
            Lifetime::Watch => &mut self.watches,
            Lifetime::Short => &mut self.shorts,
        };
        *count = count.saturating_sub(1);
    }
}

/// How long a request holds its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lifetime {
    Watch,
    Short,
}

impl Lifetime {
    pub fn of<B>(request: &Request<B>) -> Self {
        let watch = request
            .uri()
            .query()
            .is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"));
        if watch {
            Lifetime::Watch
        } else {
            Lifetime::Short
        }
    }
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// On the connection at this position: it has room.
    Use(usize),
    /// Every connection is full, but some only because of short requests: wait for one of them
    /// to end rather than open a connection that long-lived watches would leave half empty.
    Wait,
    /// Every connection is full of watches: open another.
    Open,
}

/// The first connection with room; else waiting for a short request to end where that makes
/// room; else a new connection. A request never waits for a watch to end. Each connection is
/// given with its capacity (requests at once): a connection that carries one request at a time
/// (HTTP/1.1) leaves no hole when a watch takes a new one, so its short requests are not waited
/// for.
pub(super) fn place(connections: impl IntoIterator<Item = (Load, usize)>) -> Placement {
    let mut short_ends_make_room = false;
    for (index, (load, capacity)) in connections.into_iter().enumerate() {
        if load.total() < capacity {
            return Placement::Use(index);
        }
        short_ends_make_room |= capacity > 1 && load.watches < capacity;
    }
    if short_ends_make_room {
        Placement::Wait
    } else {
        Placement::Open
    }
}

#[cfg(test)]
mod tests {
    use super::super::STREAMS_PER_CONNECTION;
    use super::*;

    const FULL: usize = STREAMS_PER_CONNECTION;

    /// An HTTP/2 connection with this load.
    fn h2(watches: usize, shorts: usize) -> (Load, usize) {
        (Load { watches, shorts }, FULL)
    }

    /// An HTTP/1.1 connection with this load.
    fn h1(watches: usize, shorts: usize) -> (Load, usize) {
        (Load { watches, shorts }, 1)
    }

    #[test]
    fn requests_go_to_the_first_connection_with_room() {
        assert_eq!(place([]), Placement::Open);
        assert_eq!(place([h2(FULL - 1, 0)]), Placement::Use(0));
        assert_eq!(place([h2(FULL, 0), h2(3, 2), h2(0, 0)]), Placement::Use(1));
        assert_eq!(place([h1(1, 0), h1(0, 0)]), Placement::Use(1));
    }

    #[test]
    fn a_connection_full_only_of_short_requests_is_waited_for() {
        assert_eq!(place([h2(FULL - 5, 5)]), Placement::Wait);
        assert_eq!(place([h2(FULL, 0), h2(0, FULL)]), Placement::Wait);
    }

    #[test]
    fn connections_full_of_watches_are_never_waited_for() {
        assert_eq!(place([h2(FULL, 0)]), Placement::Open);
        assert_eq!(place([h2(FULL, 0), h2(FULL, 0)]), Placement::Open);
    }

    #[test]
    fn a_connection_of_one_request_at_a_time_is_not_waited_for() {
        assert_eq!(place([h1(0, 1)]), Placement::Open);
        assert_eq!(place([h1(1, 0), h1(0, 1)]), Placement::Open);
    }

    #[test]
    fn watches_are_told_by_their_query() {
        let request = |uri: &str| Request::get(uri).body(()).expect("request");
        let base = "/apis/core.openfeature.dev/v1beta1/namespaces/a/featureflags";
        assert_eq!(
            Lifetime::of(&request(&format!(
                "{base}?fieldSelector=metadata.name%3Df&resourceVersion=7&watch=true"
            ))),
            Lifetime::Watch
        );
        assert_eq!(
            Lifetime::of(&request(&format!("{base}?watch=true"))),
            Lifetime::Watch
        );
        assert_eq!(
            Lifetime::of(&request(&format!(
                "{base}?fieldSelector=metadata.name%3Df&limit=500"
            ))),
            Lifetime::Short
        );
        assert_eq!(Lifetime::of(&request(base)), Lifetime::Short);
        assert_eq!(
            Lifetime::of(&request(&format!("{base}?watch=false"))),
            Lifetime::Short
        );
    }
}
