//! A member whose disk fills up exits with a message naming the file and the error (as
//! etcd does, so a supervisor restarts it) instead of staying up and answering "server
//! stopped"; restarted once space is freed, it has everything it acknowledged.
//!
//! The data directory is on a small tmpfs in a private mount namespace (`unshare -m`),
//! held open by a sleeping process; the member runs inside it (`nsenter`), and the test
//! reaches the files through `/proc/PID/root`. Needs root, as CI has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Members, free_port};

/// A tmpfs of `size` mounted at `mnt` in a mount namespace of its own, kept by the
/// returned process; `None` where namespaces or mounts are not allowed.
fn private_tmpfs(mnt: &Path, size: &str) -> Option<Child> {
    let mut holder = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size={size} tmpfs {} && echo mounted && exec sleep 600",
            mnt.display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut line = [0u8; 8];
    let mut out = holder.stdout.take()?;
    if out.read_exact(&mut line).is_err() || &line != b"mounted\n" {
        let _ = holder.kill();
        let _ = holder.wait();
        return None;
    }
    Some(holder)
}

/// `path` (inside the namespace) as seen from outside it.
fn outside(holder: &Child, path: &Path) -> PathBuf {
    Path::new(&format!("/proc/{}/root", holder.id())).join(path.strip_prefix("/").unwrap())
}

/// `oncekv serve` of a one-member cluster inside `holder`'s mount namespace.
fn serve(holder: &Child, data: &Path, client: u16, peer: u16, stderr: &Path) -> Child {
    Command::new("nsenter")
        .args(["-t", &holder.id().to_string(), "-m", "--"])
        .arg(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--name", "n1", "--data-dir"])
        .arg(data)
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-cluster",
            &format!("n1=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .expect("oncekv serve starts")
}

async fn connect(endpoint: &str) -> etcd_client::Client {
    let start = Instant::now();
    loop {
        if let Ok(mut c) = etcd_client::Client::connect([endpoint], None).await
            && c.get("probe", None).await.is_ok()
        {
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{endpoint} does not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_a_full_disk_exits_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let Some(holder) = private_tmpfs(&mnt, "8m") else {
        eprintln!("skipped: no private mount namespace here (needs root)");
        return;
    };
    let mut procs = Members(vec![holder]);
    // Most of the space goes to a filler, so the log fills it after a few MiB.
    let filler = outside(&procs.0[0], &mnt.join("filler"));
    std::fs::write(&filler, vec![0u8; 5 << 20]).unwrap();

    let data = mnt.join("data");
    let stderr_path = dir.path().join("serve.err");
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let member = serve(&procs.0[0], &data, client, peer, &stderr_path);
    procs.0.push(member);
    let mut kv = connect(&endpoint).await;

    let value = vec![b'x'; 32 * 1024];
    let mut acknowledged = Vec::new();
    for i in 0..1000 {
        let key = format!("k{i:04}");
        match tokio::time::timeout(
            Duration::from_secs(10),
            kv.put(key.clone(), value.clone(), None),
        )
        .await
        {
            Ok(Ok(_)) => acknowledged.push(key),
            _ => break,
        }
    }
    assert!(
        !acknowledged.is_empty() && acknowledged.len() < 1000,
        "the disk never filled: {} puts acknowledged",
        acknowledged.len()
    );

    // The member exits by itself, non-zero, within seconds.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = procs.0[1].try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the member is still running on a full disk"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{status}");
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    let said = stderr
        .lines()
        .find(|l| l.starts_with("oncekv: member n1 stopped on a storage error"))
        .unwrap_or_else(|| panic!("no exit message: {stderr}"));
    assert!(
        said.contains("No space left on device")
            && said.contains(&data.join("log").display().to_string()),
        "the exit message should say what failed and where: {said}"
    );

    // Space freed, restarted: everything acknowledged is there, and writes work again.
    std::fs::remove_file(&filler).unwrap();
    let member = serve(&procs.0[0], &data, client, peer, &stderr_path);
    procs.0[1] = member;
    let mut kv = connect(&endpoint).await;
    for key in &acknowledged {
        let got = kv.get(key.as_str(), None).await.unwrap();
        let kvs = got.kvs();
        assert_eq!(
            kvs.len(),
            1,
            "{key} acknowledged before the disk filled, lost"
        );
        assert_eq!(kvs[0].value(), value.as_slice());
    }
    kv.put("after", "ok", None).await.unwrap();
}
