//! `snapshot save / status / restore`: a consistent copy of a member's state, what it
//! holds, and a new cluster's data built from it (etcdctl's `snapshot save`, etcdutl's
//! `snapshot status` and `snapshot restore`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use oncekv_server::backup::Summary;

use super::output::{Format, human_bytes};
use super::{CliError, ClientFlags, Options, emit, one_shot};

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub command: SnapshotCommand,
    #[command(flatten)]
    pub flags: ClientFlags,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Stores a consistent copy of the state of the member at the (single) endpoint in
    /// FILE: every key with its history, leases, and the exactly-once sessions with their
    /// saved replies.
    Save { file: PathBuf },
    /// Prints what a copy holds, as etcdctl does: hash, revision, total keys, total size
    /// (of an etcd snapshot too).
    Status { file: PathBuf },
    /// Builds the data directory of one member of a new cluster from a copy (run it for
    /// every member, with the same FILE and --initial-cluster, then start them with
    /// `oncekv serve`).
    Restore {
        file: PathBuf,
        /// The new member's data directory (must not exist) [default: NAME.oncekv]
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The new member's name.
        #[arg(long, default_value = "default")]
        name: String,
        /// Every member of the new cluster as name=peer-url, comma separated.
        #[arg(long, default_value = "default=http://127.0.0.1:2380")]
        initial_cluster: String,
        /// This member's peer URL; must match its entry in --initial-cluster.
        #[arg(long)]
        initial_advertise_peer_urls: Option<String>,
        /// The new cluster's token (as `oncekv serve --initial-cluster-token`): mixed into
        /// its id, so that a restored cluster and the one it was copied from refuse each
        /// other's members when given different tokens.
        #[arg(long, default_value = oncekv_server::membership::DEFAULT_CLUSTER_TOKEN)]
        initial_cluster_token: String,
        /// Accept a database without the SHA-256 a snapshot ends with (a member/snap/db
        /// file copied out of an etcd data directory).
        #[arg(long)]
        skip_hash_check: bool,
    },
}

pub async fn run(opts: &Options, command: SnapshotCommand) -> Result<(), CliError> {
    match command {
        SnapshotCommand::Save { file } => {
            if opts.endpoints.len() != 1 {
                return Err(CliError::new(format!(
                    "snapshot must be requested to one selected node, not multiple {:?}",
                    opts.endpoints
                )));
            }
            one_shot(opts, |c, _| save(c, file)).await
        }
        SnapshotCommand::Status { file } => {
            let bytes = read(&file)?;
            let s = oncekv_server::backup::status(&bytes, Default::default())
                .map_err(|e| CliError::new(format!("{}: {e}", file.display())))?;
            emit(&status_text(&s, opts.printer().format()))
        }
        SnapshotCommand::Restore {
            file,
            data_dir,
            name,
            initial_cluster,
            initial_advertise_peer_urls,
            initial_cluster_token,
            skip_hash_check,
        } => {
            let members =
                crate::serve::parse_initial_cluster(&initial_cluster).map_err(CliError::new)?;
            if let Some(urls) = initial_advertise_peer_urls {
                crate::serve::check_advertised_peer_url(&name, &members, &urls)
                    .map_err(CliError::new)?;
            }
            let data_dir = data_dir.unwrap_or_else(|| PathBuf::from(format!("{name}.oncekv")));
            let bytes = read(&file)?;
            let disk = oncekv_server::disk::os_disk();
            let s = oncekv_server::backup::restore(
                &bytes,
                disk.as_ref(),
                &data_dir,
                &name,
                &members,
                &initial_cluster_token,
                oncekv_server::backup::OpenOptions {
                    skip_hash_check,
                    now_ms: oncekv_server::runtime::Clock::system().now_ms(),
                },
            )
            .map_err(CliError::new)?;
            emit(
                format!(
                    "restored snapshot {} (revision {}, {} keys, {} sessions; {}) into {} for member {name}\n",
                    file.display(),
                    s.revision,
                    s.live_keys,
                    s.sessions,
                    s.origin,
                    data_dir.display()
                )
                .as_bytes(),
            )
        }
    }
}

fn read(file: &PathBuf) -> Result<Vec<u8>, CliError> {
    std::fs::read(file).map_err(|e| CliError::new(format!("reading {}: {e}", file.display())))
}

/// Writes the copy to `file.part`, syncs it, and renames it to `file`, so a failed or
/// interrupted save never leaves a short file under the final name.
async fn save(client: oncekv_client::Client, file: PathBuf) -> Result<(), CliError> {
    let part = PathBuf::from(format!("{}.part", file.display()));
    let mut out = std::fs::File::create(&part)
        .map_err(|e| CliError::new(format!("creating {}: {e}", part.display())))?;
    let result = client.snapshot(|chunk| out.write_all(chunk)).await;
    let finished = result
        .map_err(CliError::from)
        .and_then(|_| {
            out.sync_all()
                .map_err(|e| CliError::new(format!("syncing {}: {e}", part.display())))
        })
        .and_then(|()| {
            std::fs::rename(&part, &file)
                .map_err(|e| CliError::new(format!("renaming to {}: {e}", file.display())))
        });
    if finished.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    finished?;
    emit(format!("Snapshot saved at {}\n", file.display()).as_bytes())
}

/// etcdctl's `snapshot status` output in each format.
fn status_text(s: &Summary, format: Format) -> Vec<u8> {
    match format {
        Format::Json => format!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}\n",
            s.hash, s.revision, s.total_keys, s.total_size
        )
        .into_bytes(),
        Format::Table => {
            let cells = [
                format!("{:x}", s.hash),
                s.revision.to_string(),
                s.total_keys.to_string(),
                human_bytes(s.total_size),
            ];
            super::output::table(
                &["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"],
                &[cells.to_vec()],
            )
        }
        Format::Simple => format!(
            "{:x}, {}, {}, {}\n",
            s.hash,
            s.revision,
            s.total_keys,
            human_bytes(s.total_size)
        )
        .into_bytes(),
    }
}
