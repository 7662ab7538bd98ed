//! The RDMA GID-index override (`EngineBuilder::rdma_gid_index`, env
//! `SPINWIRE_RDMA_GID_INDEX`) on a real device (Soft-RoCE in the VM, whose rxe device has
//! IPv4-mapped GIDs: a RoCE v1 and a RoCE v2 entry for the VM's address).
//!
//! Run inside the RDMA VM (`RXE_VM_IP` set) by `scripts/ci/rdma-vm.sh`, one test at a time;
//! outside it every test prints why and returns.
#![cfg(feature = "rdma")]

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use spinwire::fabric::rdma::RdmaSetupError;
use spinwire::{Connection, Engine, EngineBuilder, Error, Event, SetupError};
use spinwire_testkit::data::payload;
use spinwire_testkit::engine::{self as kit, send_bytes};
use spinwire_testkit::rdma::vm_ip;

const T: Duration = Duration::from_secs(10);

/// The kit's builders with large messages off: these tests cover the eager path (the limit is
/// the pool buffer size) and open many connections, and each large slot would be registered
/// (pinned) in the VM's 2 GiB. Large messages: `rdma_large.rs`.
fn rtc_builder(buffer_size: usize, buffers: usize) -> EngineBuilder {
    kit::rtc_builder(buffer_size, buffers).large_buffers(0)
}

/// A GID-table entry read from sysfs.
#[derive(Debug, Clone)]
struct SysGid {
    device: String,
    port: u8,
    index: u8,
    gid: Ipv6Addr,
    gid_type: String,
}

/// Every non-empty GID entry (index < 256) of every port of every RDMA device, from sysfs.
fn sysfs_gids() -> Vec<SysGid> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir("/sys/class/infiniband") else {
        return out;
    };
    for dev in devs.flatten() {
        let device = dev.file_name().to_string_lossy().into_owned();
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            let Ok(port_num) = port.file_name().to_string_lossy().parse::<u8>() else {
                continue;
            };
            for index in 0..=255u8 {
                let p = port.path();
                let Ok(text) = std::fs::read_to_string(p.join(format!("gids/{index}"))) else {
                    break;
                };
                let hex: String = text.trim().chars().filter(|c| *c != ':').collect();
                let Ok(bits) = u128::from_str_radix(&hex, 16) else {
                    continue;
                };
                let gid = Ipv6Addr::from(bits);
                if gid.is_unspecified() {
                    continue;
                }
                let gid_type = std::fs::read_to_string(p.join(format!("gid_attrs/types/{index}")))
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_default();
                out.push(SysGid {
                    device: device.clone(),
                    port: port_num,
                    index,
                    gid,
                    gid_type,
                });
            }
        }
    }
    out
}

/// The entry of `ip` (IPv4-mapped) whose type is `gid_type`.
fn gid_of(ip: &str, gid_type: &str) -> Option<SysGid> {
    let ip: Ipv4Addr = ip.parse().expect("RXE_VM_IP is an IPv4 address");
    let all = sysfs_gids();
    eprintln!("GID table: {all:?}");
    all.into_iter()
        .find(|g| g.gid.to_ipv4_mapped() == Some(ip) && g.gid_type == gid_type)
}

fn engine(gid_index: Option<u8>) -> Engine {
    rtc_builder(256, 8)
        .depth(8)
        .connect_timeout(T)
        .rdma_gid_index(gid_index)
        .build()
        .expect("engine")
}

/// The `path` of the first `Connected` event of `e`.
fn connected_path(e: &Engine) -> String {
    while let Some(ev) = e.try_event() {
        if let Event::Connected { path, .. } = ev {
            return path.expect("rdma Connected events carry the chosen path");
        }
    }
    panic!("no Connected event");
}

fn ping(a: &Connection, b: &Connection) {
    let p = payload(100, 7);
    send_bytes(a, &p);
    let m = b.recv_timeout(T).expect("recv");
    assert_eq!(&*m, p.as_slice());
}

/// Connects a client with the override set to the RoCE v2 IPv4 GID of the VM's address: the
/// connection works, and the GID index read back from the QP (connect fails otherwise) and the
/// one reported in the Connected event are the override's. The same through the environment
/// variable, and with a wildcard listener, which binds to the override's address.
#[test]
fn override_to_the_roce_v2_ipv4_gid_is_used_and_read_back() {
    let Some(ip) = vm_ip() else { return };
    let v2 = gid_of(&ip, "RoCE v2").expect("a RoCE v2 GID of the VM's address");
    eprintln!("override: {v2:?}");

    let server = engine(None);
    let client = engine(Some(v2.index));
    let ep = format!("rdma://{ip}:20301");
    let l = server.listen(&ep).expect("listen");
    let c = client.connect(&ep).expect("connect with the override");
    let s = l.accept_timeout(T).expect("accept");
    let path = connected_path(&client);
    eprintln!("client path: {path}");
    assert!(
        path.contains(&format!(
            "device {} port {} gid index {} ",
            v2.device, v2.port, v2.index
        )),
        "{path}"
    );
    assert!(path.contains(&v2.gid.to_string()), "{path}");
    ping(&c, &s);
    ping(&s, &c);
    drop((c, s, l));

    // The environment variable, when the builder leaves it unset. Tests here run one at a
    // time (--test-threads=1), so setting the variable races with nothing.
    std::env::set_var("SPINWIRE_RDMA_GID_INDEX", v2.index.to_string());
    let from_env = engine(None);
    std::env::remove_var("SPINWIRE_RDMA_GID_INDEX");
    // A wildcard listener with the override binds to the override's address.
    let wild = engine(Some(v2.index));
    let l = wild
        .listen("rdma://0.0.0.0:20302")
        .expect("wildcard listen");
    let c = from_env
        .connect(&format!("rdma://{ip}:20302"))
        .expect("connect with the override from the environment");
    let s = l.accept_timeout(T).expect("accept");
    let path = connected_path(&from_env);
    assert!(path.contains(&format!("gid index {} ", v2.index)), "{path}");
    ping(&c, &s);
}

/// The RoCE v1 entry of the same address: rdma_cm picks the GID type from the port's default
/// RoCE mode (v2 unless configured otherwise), so either the connection really uses the v1
/// index, or connect fails with the typed mismatch naming both indexes; never a connection on
/// another GID than the one asked for.
#[test]
fn override_to_the_roce_v1_gid_of_the_same_address_is_used_or_a_typed_mismatch() {
    let Some(ip) = vm_ip() else { return };
    let Some(v1) = gid_of(&ip, "IB/RoCE v1") else {
        eprintln!("skipped: no RoCE v1 GID of the VM's address");
        return;
    };
    let server = engine(None);
    let client = engine(Some(v1.index));
    let ep = format!("rdma://{ip}:20303");
    let _l = server.listen(&ep).expect("listen");
    match client.connect(&ep) {
        Ok(_c) => {
            let path = connected_path(&client);
            assert!(path.contains(&format!("gid index {} ", v1.index)), "{path}");
        }
        Err(Error::Setup(SetupError::Rdma(RdmaSetupError::GidMismatch {
            device,
            port,
            index,
            chosen,
            ..
        }))) => {
            eprintln!("mismatch: asked {index}, rdma_cm chose {chosen}");
            assert_eq!(
                (device.as_str(), port, index),
                (v1.device.as_str(), v1.port, v1.index)
            );
            assert_ne!(chosen, v1.index);
        }
        Err(e) => panic!(
            "expected a connection on index {} or GidMismatch, got {e:?}",
            v1.index
        ),
    }
}

/// An index past every configured entry (rxe's table has 1024 entries, so 255 is in range but
/// empty; a smaller table makes it out of range): connect fails at once with the typed error
/// naming the device, port and index.
#[test]
fn override_to_an_empty_or_out_of_range_index_is_a_typed_error() {
    let Some(ip) = vm_ip() else { return };
    let used: Vec<u8> = sysfs_gids().iter().map(|g| g.index).collect();
    let index = 255;
    assert!(
        !used.contains(&index),
        "GID index {index} is configured: {used:?}"
    );
    let server = engine(None);
    let client = engine(Some(index));
    let ep = format!("rdma://{ip}:20304");
    let _l = server.listen(&ep).expect("listen");
    let err = client.connect(&ep).expect_err("connect must fail");
    eprintln!(
        "{err}: {:?}",
        std::error::Error::source(&err).map(|s| s.to_string())
    );
    match err {
        Error::Setup(SetupError::Rdma(RdmaSetupError::GidEmpty {
            device,
            port,
            index: i,
        }))
        | Error::Setup(SetupError::Rdma(RdmaSetupError::GidIndexOutOfRange {
            device,
            port,
            index: i,
            ..
        })) => {
            assert!(!device.is_empty());
            assert!(port >= 1);
            assert_eq!(i, index);
        }
        e => panic!("expected GidEmpty or GidIndexOutOfRange, got {e:?}"),
    }
    // A wildcard listener with that override finds no usable entry either.
    let err = client
        .listen("rdma://0.0.0.0:20305")
        .expect_err("listen must fail");
    let src = std::error::Error::source(&err)
        .map(|s| s.to_string())
        .unwrap_or_default();
    assert!(matches!(err, Error::Listen { .. }), "{err:?}");
    assert!(
        src.contains("no RDMA device port has a usable IPv4 GID"),
        "{src}"
    );
}
