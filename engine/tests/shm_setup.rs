//! shm connection settings that cannot be settled (the pool geometry, which sizes the shared
//! segment): refused with an error on the connecting side and an event on the listener, each
//! naming every differing setting by its builder name with both values.

use std::time::{Duration, Instant};

use spinwire::{Error, Event, Mismatch, SetupError, ShmSetupError};
use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

/// The [`Mismatch`]es in `e`'s source chain, from whichever shm error carries them.
fn mismatches(e: &(dyn std::error::Error + 'static)) -> Option<Vec<Mismatch>> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(
            ShmSetupError::Refused { mismatches, .. }
            | ShmSetupError::ProposalMismatch { mismatches }
            | ShmSetupError::OfferMismatch { mismatches },
        ) = e.downcast_ref::<ShmSetupError>()
        {
            return Some(mismatches.clone());
        }
        // A setup error may be transparent (its message is its inner one's).
        if let Some(Error::Setup(SetupError::Shm(s))) = e.downcast_ref::<Error>() {
            cur = Some(s);
            continue;
        }
        if let Some(SetupError::Shm(s)) = e.downcast_ref::<SetupError>() {
            cur = Some(s);
            continue;
        }
        cur = e.source();
    }
    None
}

/// The full message of `e` and its sources.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s += ": ";
        s += &c.to_string();
        cur = c.source();
    }
    s
}

#[test]
fn different_pool_geometry_is_refused_naming_each_setting() {
    let _g = serial();
    let ep = endpoint("geometry");
    let server = rtc_engine(4096, 16);
    let client = rtc_builder(8192, 32).build().unwrap();
    let listener = server.listen(&ep).unwrap();
    let err = client
        .connect_timeout(&ep, Duration::from_secs(2))
        .expect_err("a connect with another pool geometry");
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    let text = chain(&err);
    let want = [
        Mismatch {
            setting: "buffer_size",
            ours: 8192,
            theirs: 4096,
        },
        Mismatch {
            setting: "buffers",
            ours: 32,
            theirs: 16,
        },
    ];
    assert_eq!(mismatches(&err).as_deref(), Some(&want[..]), "{text}");
    assert!(
        text.contains("buffer_size is 8192 here, 4096 at the peer")
            && text.contains("buffers is 32 here, 16 at the peer"),
        "{text}"
    );

    // The listener reports the same, from its side, as an event.
    let deadline = Instant::now() + WAIT;
    let error = loop {
        server.poll();
        if let Some(Event::Error { conn: None, error }) = server.try_event() {
            break error;
        }
        assert!(
            Instant::now() < deadline,
            "no listener event for the refusal"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let text = chain(&error);
    let want: Vec<_> = want
        .iter()
        .map(|m| Mismatch {
            ours: m.theirs,
            theirs: m.ours,
            ..*m
        })
        .collect();
    assert_eq!(mismatches(&error), Some(want), "{text}");
    assert!(
        text.contains("buffer_size is 4096 here, 8192 at the peer"),
        "{text}"
    );
    assert!(listener.try_accept().unwrap().is_none());

    // A connector configured alike is accepted.
    let alike = rtc_engine(4096, 16);
    let c = alike.connect(&ep).unwrap();
    let s = listener.accept_timeout(WAIT).unwrap();
    send_msg(&c, 1, 4000);
    recv_msg(&s, 1, 4000);
}
