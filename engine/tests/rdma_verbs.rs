//! RDMA verbs layer + rdma_cm wrappers, end to end on a real device (Soft-RoCE in the VM).
//!
//! Run inside the RDMA VM (`RXE_VM_IP` set), one test at a time:
//! `cargo test -p spinwire --features rdma --release --test rdma_verbs -- --test-threads=1`.
//! Outside the VM (no `RXE_VM_IP`) every test prints why and returns.
#![cfg(feature = "rdma")]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cm::rdma::{self as rcm, CmError, CmEventKind, CmId, ConnOptions, FlowParams};
use spinwire::fabric::rdma::verbs::{
    self, Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpCapacity,
    QpResources, QueuePair, Sge, WcSlot,
};

const BUF: usize = 4096;
const NBUF: usize = 16;
const STEP: Duration = Duration::from_secs(10);

fn vm_ip() -> Option<IpAddr> {
    match std::env::var("RXE_VM_IP") {
        Ok(ip) => Some(ip.parse().expect("RXE_VM_IP is not an IP address")),
        Err(_) => {
            eprintln!("skipped: RXE_VM_IP unset (not inside the RDMA VM)");
            None
        }
    }
}

/// One side of a connection: resources on the context rdma_cm resolved.
struct Side {
    qp: QueuePair,
    id: Arc<CmId>,
    cq: Arc<CompletionQueue>,
    rx: MemoryRegion,
    tx: MemoryRegion,
}

/// Creates PD/CQ/MRs on the id's context and the QP through rdma_cm, then pre-posts all
/// receives (before connect/accept, as iWARP requires).
fn build_side(mut id: CmId) -> Side {
    let ctx = Context::from_cm(id.device_context().expect("rdma_cm context"));
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    let rx = MemoryRegion::new(&pd, BUF * NBUF, Access::LOCAL_WRITE).unwrap();
    let tx = MemoryRegion::new(&pd, BUF * NBUF, Access::NONE).unwrap();
    let res = QpResources {
        pd: Arc::clone(&pd),
        send_cq: Arc::clone(&cq),
        recv_cq: Arc::clone(&cq),
        srq: None,
    };
    let cap = QpCapacity {
        max_send_wr: 32,
        max_recv_wr: NBUF as u32,
        max_inline_data: 64,
    };
    QueuePair::create_on_cm_id(&mut id, &res, cap, 1, Box::new(())).unwrap();
    let id = Arc::new(id);
    let qp = QueuePair::from_cm_id(&id, res).unwrap();
    assert!(
        qp.max_inline_data() >= 64,
        "inline read back: {}",
        qp.max_inline_data()
    );
    let mut side = Side { qp, id, cq, rx, tx };
    for i in 0..NBUF {
        post_recv(&mut side, i);
    }
    side
}

fn post_recv(side: &mut Side, i: usize) {
    let mut sge = Sge {
        // SAFETY: in bounds of the rx region.
        addr: unsafe { side.rx.as_ptr().add(i * BUF) } as u64,
        length: BUF as u32,
        lkey: side.rx.lkey(),
    };
    let mut wr = verbs::recv_wr_zeroed();
    wr.wr_id = i as u64;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    // SAFETY: buffer i is not touched until its completion is polled.
    unsafe { side.qp.post_recv(&mut wr) }.unwrap();
}

fn send(side: &mut Side, slot: usize, payload: &[u8], imm: u32) {
    // SAFETY: slot < NBUF: in bounds of the tx region.
    let buf = unsafe { side.tx.as_ptr().add(slot * BUF) };
    // SAFETY: slot is idle (previous send on it completed: we wait for every completion).
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), buf, payload.len()) };
    let mut sge = Sge {
        addr: buf as u64,
        length: payload.len() as u32,
        lkey: side.tx.lkey(),
    };
    let mut wr = verbs::send_wr_zeroed();
    wr.wr_id = 1000 + slot as u64;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = verbs::WR_SEND_WITH_IMM;
    wr.send_flags = verbs::SEND_SIGNALED;
    if payload.len() as u32 <= side.qp.max_inline_data() {
        wr.send_flags |= verbs::SEND_INLINE;
    }
    verbs::set_imm(&mut wr, imm);
    // SAFETY: the tx slot stays untouched until the send completion is polled below.
    unsafe { side.qp.post_send(&mut wr) }.unwrap();
}

/// Polls until a completion arrives (or panics after STEP); returns (wr_id, byte_len, imm).
fn wait_wc(side: &Side) -> (u64, u32, Option<u32>) {
    let deadline = Instant::now() + STEP;
    let mut slots = [const { WcSlot::uninit() }; 8];
    loop {
        let wcs = side.cq.poll(&mut slots[..1]).unwrap();
        if let Some(wc) = wcs.first() {
            assert!(wc.is_ok(), "completion error: {wc:?}");
            return (wc.wr_id(), wc.byte_len(), wc.imm());
        }
        assert!(Instant::now() < deadline, "no completion within {STEP:?}");
        thread::yield_now();
    }
}

fn params() -> FlowParams {
    FlowParams {
        credits: NBUF as u32,
        buffer_size: BUF as u32,
        inline_size: 64,
    }
}

fn payload(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

#[test]
fn connect_send_recv_with_verified_payloads() {
    let Some(ip) = vm_ip() else { return };
    let opts = ConnOptions::default();
    let listener = rcm::CmListener::bind(SocketAddr::new(ip, 0), 8).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let sizes: Vec<usize> = (1..=BUF)
        .filter(|s| *s <= 80 || s % 97 == 0 || *s == BUF)
        .collect();
    let server_sizes = sizes.clone();

    let server = thread::spawn(move || {
        let req = listener
            .get_request(Some(STEP))
            .unwrap()
            .expect("connect request");
        let peer = FlowParams::decode(&req.private_data).expect("valid client params");
        assert_eq!(peer, params());
        let peer_addr = req.id.peer_addr().unwrap();
        let mut side = build_side(req.id);
        side.id.accept(&opts, &params().encode()).unwrap();
        side.id
            .wait_for(CmEventKind::Established, Instant::now() + STEP, peer_addr)
            .unwrap();
        side.qp.set_min_rnr_timer(opts.min_rnr_timer).unwrap();
        eprintln!("server: {}", side.id.path_info().unwrap());
        // Echo every message back, verified. The previous echo's send completion may arrive
        // after the next message (the client can see the echo first).
        let mut send_pending = false;
        for (n, &len) in server_sizes.iter().enumerate() {
            let (mut wr_id, mut got, mut imm) = wait_wc(&side);
            if wr_id == 1000 {
                assert!(send_pending);
                send_pending = false;
                (wr_id, got, imm) = wait_wc(&side);
            }
            assert!(wr_id < NBUF as u64, "expected a receive, got wr {wr_id}");
            assert_eq!(got as usize, len);
            assert_eq!(imm, Some(n as u32));
            let slot = wr_id as usize;
            // SAFETY: the receive completed; the buffer is ours until re-posted.
            let data = unsafe { std::slice::from_raw_parts(side.rx.as_ptr().add(slot * BUF), len) };
            assert_eq!(
                data,
                payload(len, n as u32).as_slice(),
                "payload {n} ({len} B)"
            );
            let echo = data.to_vec();
            post_recv(&mut side, slot);
            if send_pending {
                assert_eq!(wait_wc(&side).0, 1000);
            }
            send(&mut side, 0, &echo, n as u32);
            send_pending = true;
        }
        if send_pending {
            assert_eq!(wait_wc(&side).0, 1000);
        }
        // The client disconnects: we must see DISCONNECTED.
        let ev = side
            .id
            .channel()
            .get_event(Some(STEP))
            .unwrap()
            .expect("disconnect event");
        assert_eq!(ev.kind, CmEventKind::Disconnected);
    });

    let deadline = Instant::now() + STEP;
    let id = rcm::resolve(addr, &opts, deadline).unwrap();
    let mut side = build_side(id);
    side.id.connect(&opts, &params().encode()).unwrap();
    let ev = side
        .id
        .wait_for(CmEventKind::Established, deadline, addr)
        .unwrap();
    assert_eq!(FlowParams::decode(&ev.private_data).unwrap(), params());
    side.qp.set_min_rnr_timer(opts.min_rnr_timer).unwrap();
    let info = side.id.path_info().unwrap();
    eprintln!("client: {info}");
    if let Ok(dev) = std::env::var("RXE_VM_DEV") {
        assert_eq!(info.device, dev);
    }
    if let Ok(gid) = std::env::var("RXE_VM_GID_INDEX") {
        assert_eq!(
            info.gid_index.to_string(),
            gid,
            "rdma_cm should pick the RoCEv2 IPv4 GID"
        );
    }

    for (n, &len) in sizes.iter().enumerate() {
        let p = payload(len, n as u32);
        send(&mut side, 1, &p, n as u32);
        // Send completion and echo may come in either order.
        let mut got_send = false;
        let mut got_echo = false;
        while !(got_send && got_echo) {
            let (wr_id, blen, imm) = wait_wc(&side);
            if wr_id == 1001 {
                got_send = true;
            } else {
                let slot = wr_id as usize;
                assert_eq!(blen as usize, len);
                assert_eq!(imm, Some(n as u32));
                // SAFETY: the receive completed.
                let data =
                    unsafe { std::slice::from_raw_parts(side.rx.as_ptr().add(slot * BUF), len) };
                assert_eq!(data, p.as_slice(), "echo {n} ({len} B)");
                post_recv(&mut side, slot);
                got_echo = true;
            }
        }
    }
    side.id.disconnect().unwrap();
    let ev = side
        .id
        .channel()
        .get_event(Some(STEP))
        .unwrap()
        .expect("own disconnect event");
    assert_eq!(ev.kind, CmEventKind::Disconnected);
    server.join().unwrap();
}

#[test]
fn connect_to_port_without_listener_is_a_typed_error_fast() {
    let Some(ip) = vm_ip() else { return };
    let start = Instant::now();
    let addr = SocketAddr::new(ip, 1); // nobody listens on rdma_cm port 1
    let deadline = start + STEP;
    let opts = ConnOptions::default();
    let id = rcm::resolve(addr, &opts, deadline).unwrap();
    let side = build_side(id);
    side.id.connect(&opts, &params().encode()).unwrap();
    let err = side
        .id
        .wait_for(CmEventKind::Established, deadline, addr)
        .unwrap_err();
    assert!(matches!(err, CmError::NoListener { .. }), "got {err:?}");
    assert!(err.to_string().contains("no listener"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    drop(side);
}

#[test]
fn unreachable_and_bad_addresses_are_typed_errors_fast() {
    let Some(ip) = vm_ip() else { return };
    let opts = ConnOptions {
        resolve_timeout_ms: 500,
        ..ConnOptions::default()
    };
    // An address on the VM's subnet that nobody owns: ARP fails -> ADDR_ERROR.
    let IpAddr::V4(v4) = ip else {
        panic!("IPv4 expected")
    };
    let o = v4.octets();
    let dead = SocketAddr::from(([o[0], o[1], o[2], o[3].wrapping_add(100)], 7471));
    let start = Instant::now();
    let err = rcm::resolve(dead, &opts, start + STEP)
        .and_then(|id| {
            let side = build_side(id);
            side.id.connect(&opts, &params().encode())?;
            side.id
                .wait_for(CmEventKind::Established, start + STEP, dead)
                .map(|_| ())
        })
        .unwrap_err();
    eprintln!("unreachable {dead}: {err} after {:?}", start.elapsed());
    assert!(
        matches!(
            err,
            CmError::AddrError { .. }
                | CmError::RouteError { .. }
                | CmError::Unreachable { .. }
                | CmError::Timeout { .. }
        ),
        "got {err:?}"
    );
    assert!(
        start.elapsed() < STEP + Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );

    // A host name that does not resolve.
    let err = rcm::resolve_host("no-such-host.invalid", 7471).unwrap_err();
    assert!(matches!(err, CmError::Resolve { .. }), "got {err:?}");

    // Binding to an address that no local RDMA device owns.
    let err = rcm::CmListener::bind(SocketAddr::from(([192, 0, 2, 1], 7471)), 1).unwrap_err();
    assert!(matches!(err, CmError::Bind { .. }), "got {err:?}");
}

#[test]
fn rejected_connection_carries_reason() {
    let Some(ip) = vm_ip() else { return };
    let opts = ConnOptions::default();
    let listener = rcm::CmListener::bind(SocketAddr::new(ip, 0), 8).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let req = listener
            .get_request(Some(STEP))
            .unwrap()
            .expect("connect request");
        // A foreign client: its private data is not ours -> reject with a reason.
        let err = FlowParams::decode(&req.private_data).unwrap_err();
        eprintln!("server rejects: {err}");
        req.id
            .reject(&rcm::CmRejectReason::BadParams.encode())
            .unwrap();
    });
    let deadline = Instant::now() + STEP;
    let id = rcm::resolve(addr, &opts, deadline).unwrap();
    let side = build_side(id);
    side.id
        .connect(&opts, b"not spinwire private data")
        .unwrap();
    let err = side
        .id
        .wait_for(CmEventKind::Established, deadline, addr)
        .unwrap_err();
    match err {
        CmError::Rejected { private_data, .. } => assert_eq!(
            rcm::CmRejectReason::decode(&private_data),
            Some(rcm::CmRejectReason::BadParams)
        ),
        other => panic!("expected Rejected, got {other:?}"),
    }
    server.join().unwrap();
}
