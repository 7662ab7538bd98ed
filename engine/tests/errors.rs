//! Typed configuration errors: each invalid knob names its value and its limit (issue #15).

use std::time::Duration;

use spinwire::{ConfigError, Engine, Error, IdleStrategy, MAX_BATCH, MAX_BUFFER_SIZE};

#[test]
fn config_errors_carry_the_value_and_the_limit() {
    // IdleStrategy::Block: max_sleep in (0, 1 s], spin at most 1 s; each bound refused typed.
    for (spin, max_sleep) in [
        (Duration::from_micros(50), Duration::ZERO),
        (Duration::from_micros(50), Duration::from_millis(1001)),
        (Duration::from_millis(1001), Duration::from_millis(100)),
    ] {
        match Engine::builder()
            .idle(IdleStrategy::Block { spin, max_sleep })
            .build()
        {
            Err(e @ Error::Config(ConfigError::BlockSleep { .. })) => {
                assert!(e.to_string().contains("max_sleep"), "{e}");
                let Error::Config(ConfigError::BlockSleep {
                    spin: s,
                    max_sleep: m,
                }) = e
                else {
                    unreachable!()
                };
                assert_eq!((s, m), (spin, max_sleep));
            }
            other => panic!("Block {{ {spin:?}, {max_sleep:?} }}: got {other:?}"),
        }
    }
    assert!(Engine::builder()
        .idle(IdleStrategy::Block {
            spin: Duration::ZERO,
            max_sleep: Duration::from_secs(1),
        })
        .build()
        .is_ok());
    match Engine::builder().pool(MAX_BUFFER_SIZE + 1, 4).build() {
        Err(Error::Config(ConfigError::BufferSize { value, max })) => {
            assert_eq!((value, max), (MAX_BUFFER_SIZE + 1, MAX_BUFFER_SIZE));
        }
        other => panic!("got {other:?}"),
    }
    match Engine::builder().pool(64, 4).depth(5).build() {
        Err(
            e @ Error::Config(ConfigError::Depth {
                value: 5,
                buffers: 4,
            }),
        ) => {
            assert_eq!(
                e.to_string(),
                "invalid configuration: depth 5 must be in 1..=buffers (4)"
            );
        }
        other => panic!("got {other:?}"),
    }
    match Engine::builder().batch(MAX_BATCH + 1).build() {
        Err(Error::Config(ConfigError::Batch { value, max })) => {
            assert_eq!((value, max), (MAX_BATCH + 1, MAX_BATCH));
        }
        other => panic!("got {other:?}"),
    }
    match Engine::builder().pollers(&[0, 0]).build() {
        Err(Error::Config(ConfigError::DuplicateCore { core: 0 })) => {}
        other => panic!("got {other:?}"),
    }
    match Engine::builder().max_connections_per_listener(0).build() {
        Err(Error::Config(ConfigError::MaxConnectionsPerListener)) => {}
        other => panic!("got {other:?}"),
    }
}

/// An error and its `source` chain, `: `-separated (as a chain printer shows it).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

#[test]
fn a_failed_connections_error_states_its_reason_once() {
    use spinwire::FabricError;
    let e = Error::Fabric(FabricError::PeerUnresponsive {
        silent_for: std::time::Duration::from_millis(1060),
    });
    let text = chain(&e);
    assert_eq!(
        text,
        "connection failed: peer unresponsive: nothing heard for 1.06s"
    );
    assert!(
        matches!(
            std::error::Error::source(&e).and_then(|s| s.downcast_ref::<FabricError>()),
            Some(FabricError::PeerUnresponsive { .. })
        ),
        "the reason is the source"
    );
    let e = Error::Fabric(FabricError::Protocol("bad descriptor"));
    assert_eq!(
        chain(&e),
        "connection failed: peer protocol violation: bad descriptor"
    );
}
