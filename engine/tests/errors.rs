//! Typed configuration errors: each invalid knob names its value and its limit (issue #15).

use spinwire::{ConfigError, Engine, Error, MAX_BATCH, MAX_BUFFER_SIZE};

#[test]
fn config_errors_carry_the_value_and_the_limit() {
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
}
