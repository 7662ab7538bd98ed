use std::time::Duration;

use spinwire::{Engine, IdleStrategy};

#[test]
fn inline_pingpong_in_process() {
    let name = format!("smoke-{}", std::process::id());
    let engine = Engine::builder()
        .run_to_completion()
        .idle(IdleStrategy::backoff())
        .build()
        .unwrap();
    let listener = engine.listen(&format!("shm://{name}")).unwrap();
    let client = engine.connect(&format!("shm://{name}")).unwrap();
    let server = listener.accept_timeout(Duration::from_secs(5)).unwrap();
    for i in 0..1000u32 {
        let mut b = client.alloc().unwrap();
        b.copy_from(&i.to_le_bytes()).unwrap();
        client.send(b).unwrap();
        let m = server.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&m[..], &i.to_le_bytes());
        let mut b = server.alloc().unwrap();
        b.copy_from(&m).unwrap();
        drop(m);
        server.send(b).unwrap();
        let m = client.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&m[..], &i.to_le_bytes());
    }
    // Large (pooled) messages.
    for i in 0..1000u32 {
        let mut b = client.alloc().unwrap();
        let cap = b.capacity();
        b.as_mut_slice().fill(i as u8);
        b.set_len(cap).unwrap();
        client.send(b).unwrap();
        let m = server.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m.len(), cap);
        assert!(m.iter().all(|&x| x == i as u8));
    }
}
