//! Owns the `nvmf rpc` command line: SPDK rpc.py's global options and, for
//! every method nvmfd implements, rpc.py's positional arguments and flags
//! (short and long spellings, choices, required options, help texts and an
//! example), kept as one table (`COMMANDS`) that becomes one clap subcommand
//! per method; clap parses and writes help and errors. The matches become the
//! same request parameters rpc.py would send (unset options left out,
//! `store_true` flags sent as `false`, `listen_address` / `namespace`
//! grouped, `discovery` shortcut).
//! `save_config` / `load_config` follow rpc.py's client-side behaviour:
//! save assembles `framework_get_subsystems` + `framework_get_config`
//! (works against SPDK too); load sends nvmfd's atomic `load_config` with the
//! document from stdin (or `-j`), falling back to one call per entry when the
//! server has no `load_config` method.

use std::io::{Read, Write};
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{
    value_parser, Arg, ArgAction, ArgGroup, ArgMatches, ColorChoice, Command, CommandFactory,
    FromArgMatches,
};
use serde_json::{json, Map, Value};

use crate::client::{ClientError, RpcClient};
use crate::error::METHOD_NOT_FOUND;
use crate::DEFAULT_RPC_SOCKET;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A string value.
    Str,
    /// An integer value.
    Int,
    /// A floating point value.
    Float,
    /// `store_true`: `false` unless given.
    True,
    /// `store_false`: `true` unless given.
    False,
    /// `--x` / `--no-x` (argparse `BooleanOptionalAction`): unset unless given.
    BoolOpt,
    /// Comma-separated list of strings.
    List,
    /// `key=value`, repeatable (argparse `append`): an object of strings.
    KeyValue,
}

struct Opt {
    short: &'static str,
    long: &'static str,
    dest: &'static str,
    kind: Kind,
    required: bool,
    choices: &'static [&'static str],
    help: &'static str,
}

const fn o(
    short: &'static str,
    long: &'static str,
    dest: &'static str,
    kind: Kind,
    help: &'static str,
) -> Opt {
    Opt {
        short,
        long,
        dest,
        kind,
        required: false,
        choices: &[],
        help,
    }
}

const fn req(mut opt: Opt) -> Opt {
    opt.required = true;
    opt
}

const fn choices(mut opt: Opt, c: &'static [&'static str]) -> Opt {
    opt.choices = c;
    opt
}

struct Pos {
    dest: &'static str,
    kind: Kind,
    optional: bool,
    help: &'static str,
}

const fn p(dest: &'static str, kind: Kind, help: &'static str) -> Pos {
    Pos {
        dest,
        kind,
        optional: false,
        help,
    }
}

const fn optional(mut pos: Pos) -> Pos {
    pos.optional = true;
    pos
}

type Build = fn(Map<String, Value>) -> Result<Map<String, Value>, String>;

struct Cmd {
    name: &'static str,
    help: &'static str,
    pos: &'static [Pos],
    opts: &'static [Opt],
    build: Build,
    example: &'static str,
}

use Kind::*;

const TGT_T: Opt = o(
    "-t",
    "--tgt-name",
    "tgt_name",
    Str,
    "Parent NVMe-oF target name (accepted, ignored: nvmfd has one target)",
);
const TGT_P: Opt = o(
    "-p",
    "--tgt-name",
    "tgt_name",
    Str,
    "Parent NVMe-oF target name (accepted, ignored)",
);
const NQN: Pos = p("nqn", Str, "Subsystem NQN");

const ONCS: &[&str] = &["nvmcmps", "nvmdsmsv", "nvmwzsv", "reservs", "nvmcpys"];
const FUSES: &[&str] = &["fcws"];

static COMMANDS: &[Cmd] = &[
    Cmd {
        name: "rpc_get_methods",
        help: "Get list of supported RPC methods",
        pos: &[],
        opts: &[
            o("-c", "--current", "current", True, "Return only RPC methods callable in the current state"),
            o("-i", "--include-aliases", "include_aliases", True, "Include deprecated method aliases"),
        ],
        build: plain,
        example: "nvmf rpc rpc_get_methods",
    },
    Cmd {
        name: "spdk_get_version",
        help: "Get the version of the target (nvmfd)",
        pos: &[],
        opts: &[],
        build: plain,
        example: "nvmf rpc spdk_get_version",
    },
    Cmd {
        name: "save_config",
        help: "Write the current configuration (SPDK save_config JSON) to stdout",
        pos: &[],
        opts: &[
            o("-i", "--indent", "indent", Int, "Indent level; < 0 means compact. Default 2"),
            o("-s", "--subsystems", "subsystems", Str, "Comma-separated list of subsystems (and their dependencies) to save"),
            o("", "--with-batches", "with_batches", BoolOpt, "Keep batch arrays in output (nvmfd never writes batches)"),
        ],
        build: plain,
        example: "nvmf rpc save_config > nvmfd.json",
    },
    Cmd {
        name: "load_config",
        help: "Configure the target from a save_config JSON document read from stdin (nvmfd: replaces the whole configuration atomically)",
        pos: &[],
        opts: &[
            o("-i", "--include-aliases", "include_aliases", True, "include RPC aliases"),
            o("-j", "--json-conf", "json_conf", Str, "JSON configuration: a file path or the JSON text (default: stdin)"),
        ],
        build: plain,
        example: "nvmf rpc load_config < nvmfd.json",
    },
    Cmd {
        name: "bdev_malloc_create",
        help: "Create a bdev with malloc backend; prints its name",
        pos: &[
            p("total_size", Float, "Size of malloc bdev in MiB (float > 0)"),
            p("block_size", Int, "Data block size for this bdev"),
        ],
        opts: &[
            o("-b", "--name", "name", Str, "Name of the bdev (default: MallocN)"),
            o("-u", "--uuid", "uuid", Str, "UUID of the bdev (optional)"),
            o("-p", "--physical-block-size", "physical_block_size", Int, "Physical block size (accepted, ignored)"),
            o("-o", "--optimal-io-boundary", "optimal_io_boundary", Int, "Split on optimal IO boundary (accepted, ignored)"),
            o("-m", "--md-size", "md_size", Int, "Metadata size (only 0 is supported)"),
            o("-i", "--md-interleave", "md_interleave", True, "Metadata interleaved (accepted, ignored)"),
            choices(o("-t", "--dif-type", "dif_type", Int, "Protection information type (only 0 is supported)"), &["0", "1", "2", "3"]),
            o("-d", "--dif-is-head-of-md", "dif_is_head_of_md", True, "PI in the first 8 bytes of metadata (accepted, ignored)"),
            choices(o("-f", "--dif-pi-format", "dif_pi_format", Int, "Protection information format (accepted, ignored)"), &["0", "1", "2"]),
            o("-n", "--numa-id", "numa_id", Int, "NUMA node ID (accepted, ignored)"),
        ],
        build: malloc_create,
        example: "nvmf rpc bdev_malloc_create -b Malloc0 512 512",
    },
    Cmd {
        name: "bdev_malloc_delete",
        help: "Delete a malloc bdev (it must not back a namespace)",
        pos: &[p("name", Str, "malloc bdev name")],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_malloc_delete Malloc0",
    },
    Cmd {
        name: "bdev_null_create",
        help: "Add a bdev with null backend (writes discarded, reads return zeroes); prints its name",
        pos: &[
            p("name", Str, "Block device name"),
            p("total_size", Int, "Size of null bdev in MiB (int > 0)"),
            p("block_size", Int, "Data block size for this bdev"),
        ],
        opts: &[
            o("-u", "--uuid", "uuid", Str, "UUID of the bdev (optional)"),
            o("-p", "--physical-block-size", "physical_block_size", Int, "Physical block size (accepted, ignored)"),
            o("-m", "--md-size", "md_size", Int, "Metadata size (only 0 is supported)"),
            choices(o("-t", "--dif-type", "dif_type", Int, "Protection information type (only 0 is supported)"), &["0", "1", "2", "3"]),
            o("-d", "--dif-is-head-of-md", "dif_is_head_of_md", True, "(accepted, ignored)"),
            choices(o("-f", "--dif-pi-format", "dif_pi_format", Int, "(accepted, ignored)"), &["0", "1", "2"]),
            o("-a", "--preferred-write-alignment", "preferred_write_alignment", Int, "(accepted, ignored)"),
            o("-g", "--preferred-write-granularity", "preferred_write_granularity", Int, "(accepted, ignored)"),
            o("-s", "--optimal-write-size", "optimal_write_size", Int, "(accepted, ignored)"),
            o("-c", "--preferred-unmap-alignment", "preferred_unmap_alignment", Int, "(accepted, ignored)"),
            o("-r", "--preferred-unmap-granularity", "preferred_unmap_granularity", Int, "(accepted, ignored)"),
        ],
        build: null_create,
        example: "nvmf rpc bdev_null_create Null0 1024 4096",
    },
    Cmd {
        name: "bdev_null_delete",
        help: "Delete a null bdev (it must not back a namespace)",
        pos: &[p("name", Str, "null bdev name")],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_null_delete Null0",
    },
    Cmd {
        name: "bdev_uring_create",
        help: "Create a bdev on a file or block device, served with io_uring; prints its name",
        pos: &[
            p("filename", Str, "Path to device or file (ex: /dev/nvme0n1)"),
            p("name", Str, "bdev name"),
            optional(p("block_size", Int, "Block size for this bdev (default: detected)")),
        ],
        opts: &[o("-u", "--uuid", "uuid", Str, "UUID of the bdev")],
        build: plain,
        example: "nvmf rpc bdev_uring_create /dev/nvme0n1 Uring0",
    },
    Cmd {
        name: "bdev_uring_delete",
        help: "Delete a uring bdev (it must not back a namespace)",
        pos: &[p("name", Str, "uring bdev name")],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_uring_delete Uring0",
    },
    Cmd {
        name: "bdev_aio_create",
        help: "Add a bdev on a file or block device (nvmfd serves it with io_uring); prints its name",
        pos: &[
            p("filename", Str, "Path to device or file (ex: /dev/sda)"),
            p("name", Str, "Block device name"),
            optional(p("block_size", Int, "Block size for this bdev (default: detected)")),
        ],
        opts: &[
            o("-r", "--readonly", "readonly", True, "Set this bdev as read-only"),
            o("", "--fallocate", "fallocate", True, "Support unmap/write zeroes by fallocate"),
            o("-u", "--uuid", "uuid", Str, "UUID of the bdev (optional)"),
            o("", "--no-wait", "nowait", True, "RWF_NOWAIT (accepted, ignored)"),
        ],
        build: plain,
        example: "nvmf rpc bdev_aio_create /var/lib/nvmfd/disk0.img Aio0 4096",
    },
    Cmd {
        name: "bdev_aio_delete",
        help: "Delete an aio bdev (it must not back a namespace)",
        pos: &[p("name", Str, "aio bdev name")],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_aio_delete Aio0",
    },
    Cmd {
        name: "bdev_rbd_register_cluster",
        help: "Register a Ceph cluster connection that rbd bdevs can share (-c of bdev_rbd_create); prints its name",
        pos: &[p("name", Str, "Name of the Rados cluster only known to rbd bdevs")],
        opts: &[
            o("", "--user", "user_id", Str, "Ceph user name (i.e. admin, not client.admin)"),
            o("", "--config-param", "config_param", KeyValue, "A key=value librados configuration option (repeatable; default: rely on the config file)"),
            o("", "--config-file", "config_file", Str, "Path of the Ceph configuration file"),
            o("", "--key-file", "key_file", Str, "Path of the Ceph keyring file"),
            o("", "--core-mask", "core_mask", Str, "Core mask for librbd I/O threads (accepted, ignored)"),
        ],
        build: plain,
        example: "nvmf rpc bdev_rbd_register_cluster ceph1 --config-file /etc/ceph/ceph.conf --key-file /etc/ceph/ceph.client.admin.keyring",
    },
    Cmd {
        name: "bdev_rbd_unregister_cluster",
        help: "Unregister a Ceph cluster connection (no rbd bdev may use it)",
        pos: &[p("name", Str, "Name of the Rados cluster only known to rbd bdevs")],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_rbd_unregister_cluster ceph1",
    },
    Cmd {
        name: "bdev_rbd_get_clusters_info",
        help: "Display the registered Ceph clusters or one of them",
        pos: &[],
        opts: &[o("-b", "--name", "name", Str, "Name of a registered cluster")],
        build: plain,
        example: "nvmf rpc bdev_rbd_get_clusters_info -b ceph1",
    },
    Cmd {
        name: "bdev_rbd_create",
        help: "Add a bdev on a Ceph RBD image; prints its name",
        pos: &[
            p("pool_name", Str, "rbd pool name"),
            p("rbd_name", Str, "rbd image name"),
            p("block_size", Int, "Block size of the bdev (512, 1024, 2048 or 4096)"),
        ],
        opts: &[
            o("-b", "--name", "name", Str, "Name of the bdev (default: CephN)"),
            o("", "--user", "user_id", Str, "Ceph user name (i.e. admin, not client.admin)"),
            o("", "--config", "config", KeyValue, "A key=value librados configuration option (repeatable; default: rely on the config file)"),
            o("-c", "--cluster-name", "cluster_name", Str, "A cluster registered with bdev_rbd_register_cluster"),
            o("-u", "--uuid", "uuid", Str, "UUID of the bdev"),
            o("-r", "--readonly", "read_only", True, "Set this bdev as read-only (the image is opened read-only; hosts see a write-protected namespace)"),
        ],
        build: plain,
        example: "nvmf rpc bdev_rbd_create -b Rbd0 -c ceph1 rbd image0 4096",
    },
    Cmd {
        name: "bdev_rbd_delete",
        help: "Delete an rbd bdev (it must not back a namespace; the image stays in Ceph)",
        pos: &[p("name", Str, "rbd bdev name")],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_rbd_delete Rbd0",
    },
    Cmd {
        name: "bdev_rbd_resize",
        help: "Grow an rbd bdev's image (hosts get a Namespace Attribute Changed event)",
        pos: &[
            p("name", Str, "rbd bdev name"),
            p("new_size", Int, "New size in MiB (not smaller than the current size)"),
        ],
        opts: &[],
        build: plain,
        example: "nvmf rpc bdev_rbd_resize Rbd0 20480",
    },
    Cmd {
        name: "bdev_get_bdevs",
        help: "Display the bdev list or one bdev",
        pos: &[],
        opts: &[
            o("-b", "--name", "name", Str, "Name of the bdev"),
            o("-t", "--timeout-ms", "timeout", Int, "Time to wait for the bdev to appear (accepted, ignored: bdevs appear synchronously)"),
        ],
        build: plain,
        example: "nvmf rpc bdev_get_bdevs -b Malloc0",
    },
    Cmd {
        name: "bdev_get_iostat",
        help: "Display I/O statistics of all bdevs or of the named ones (reads and writes through the namespaces on them)",
        pos: &[],
        opts: &[
            o("-b", "--name", "name", Str, "Name of the bdev (older rpc.py; v26.05 uses --names)"),
            o("", "--names", "names", List, "Bdev names to obtain I/O statistics from, comma-separated list in quotes"),
            o("-c", "--per-channel", "per_channel", True, "Display per channel IO stats (not supported by nvmfd: it counts per queue pair, see nvmf_get_path_stats)"),
            choices(o("", "--reset-mode", "reset_mode", Str, "Mode to reset I/O statistics after getting (nvmfd: none only)"), &["all", "maxmin", "error", "none"]),
        ],
        build: plain,
        example: "nvmf rpc bdev_get_iostat --names Malloc0,Rbd0",
    },
    Cmd {
        name: "bdev_set_qos_limit",
        help: "Set QoS rate limits on a bdev, live (commands over the limit wait, they never fail; limits not given are unchanged, 0 turns one off; see docs/QOS.md)",
        pos: &[p("name", Str, "Blockdev name to set QoS. Example: Malloc0")],
        opts: &[
            o("", "--rw-ios-per-sec", "rw_ios_per_sec", Int, "R/W IOs per second limit (>=1000, rounded up to a multiple of 1000; 0 = unlimited)"),
            o("", "--rw-mbytes-per-sec", "rw_mbytes_per_sec", Int, "R/W megabytes (MiB) per second limit (0 = unlimited)"),
            o("", "--r-mbytes-per-sec", "r_mbytes_per_sec", Int, "Read megabytes (MiB) per second limit (0 = unlimited)"),
            o("", "--w-mbytes-per-sec", "w_mbytes_per_sec", Int, "Write megabytes (MiB) per second limit (0 = unlimited)"),
        ],
        build: plain,
        example: "nvmf rpc bdev_set_qos_limit Malloc0 --rw-ios-per-sec 20000 --w-mbytes-per-sec 100",
    },
    Cmd {
        name: "nvmf_create_transport",
        help: "Create an NVMe-oF transport (nvmfd: TCP or RDMA)",
        pos: &[],
        opts: &[
            req(o("-t", "--trtype", "trtype", Str, "Transport type (TCP, RDMA)")),
            o("-g", "--tgt-name", "tgt_name", Str, "Parent NVMe-oF target name (accepted, ignored)"),
            o("-q", "--max-queue-depth", "max_queue_depth", Int, "Max number of outstanding I/O per queue"),
            o("-m", "--max-io-qpairs-per-ctrlr", "max_io_qpairs_per_ctrlr", Int, "Max number of IO qpairs per controller"),
            o("-c", "--in-capsule-data-size", "in_capsule_data_size", Int, "Max in-capsule data size (bytes)"),
            o("-i", "--max-io-size", "max_io_size", Int, "Max I/O size (bytes)"),
            o("-u", "--io-unit-size", "io_unit_size", Int, "I/O unit size (bytes)"),
            o("-a", "--max-aq-depth", "max_aq_depth", Int, "Max number of admin cmds per AQ"),
            o("-n", "--num-shared-buffers", "num_shared_buffers", Int, "Data buffer budget, in io_unit_size units"),
            o("-b", "--buf-cache-size", "buf_cache_size", Int, "(accepted, ignored)"),
            o("", "--iobuf-small-cache-size", "iobuf_small_cache_size", Int, "(accepted, ignored)"),
            o("", "--iobuf-large-cache-size", "iobuf_large_cache_size", Int, "(accepted, ignored)"),
            o("-z", "--zcopy", "zcopy", True, "(accepted, ignored)"),
            o("-d", "--num-cqe", "num_cqe", Int, "Number of CQ entries, used without SRQ (RDMA only)"),
            o("-s", "--max-srq-depth", "max_srq_depth", Int, "Entries of the per-poller shared receive queue (RDMA only)"),
            o("-r", "--no-srq", "no_srq", True, "Disable shared receive queues even where the device has them (RDMA only)"),
            o("-o", "--c2h-success", "c2h_success", False, "Disable C2H success optimization (TCP only)"),
            o("-f", "--dif-insert-or-strip", "dif_insert_or_strip", True, "(accepted, ignored)"),
            o("-y", "--sock-priority", "sock_priority", Int, "(accepted, ignored)"),
            o("-l", "--acceptor-backlog", "acceptor_backlog", Int, "Pending connection requests before new ones are refused (RDMA only)"),
            o("-x", "--abort-timeout-sec", "abort_timeout_sec", Int, "(accepted, ignored)"),
            o("-w", "--no-wr-batching", "no_wr_batching", True, "Disable work request batching (RDMA only)"),
            o("-e", "--control-msg-num", "control_msg_num", Int, "(accepted, ignored)"),
            o("-M", "--disable-mappable-bar0", "disable_mappable_bar0", True, "VFIO-USER only (accepted, ignored)"),
            o("-I", "--disable-adaptive-irq", "disable_adaptive_irq", True, "VFIO-USER only (accepted, ignored)"),
            o("-S", "--disable-shadow-doorbells", "disable_shadow_doorbells", True, "VFIO-USER only (accepted, ignored)"),
            o("", "--acceptor-poll-rate", "acceptor_poll_rate", Int, "(accepted, ignored)"),
            o("", "--ack-timeout", "ack_timeout", Int, "(accepted, ignored)"),
            o("", "--data-wr-pool-size", "data_wr_pool_size", Int, "RDMA data WR pool size (accepted, ignored)"),
            o("", "--disable-command-passthru", "disable_command_passthru", True, "(accepted, ignored)"),
            o("", "--kas", "kas", Int, "(accepted, ignored)"),
            o("", "--min-kato", "min_kato", Int, "(accepted, ignored)"),
            o("", "--masked-oncs", "masked_oncs", List, "Comma-separated ONCS features to mask: all, nvmcmps, nvmdsmsv, nvmwzsv, reservs, nvmcpys (accepted, ignored)"),
            o("", "--masked-fuses", "masked_fuses", List, "Comma-separated FUSES to mask: all, fcws (accepted, ignored)"),
        ],
        build: create_transport,
        example: "nvmf rpc nvmf_create_transport -t TCP -u 8192 -i 131072 -c 8192",
    },
    Cmd {
        name: "nvmf_get_transports",
        help: "Display nvmf transports or one transport",
        pos: &[],
        opts: &[o("", "--trtype", "trtype", Str, "Transport type"), TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_get_transports",
    },
    Cmd {
        name: "nvmf_get_subsystems",
        help: "Display nvmf subsystems or one subsystem",
        pos: &[optional(NQN)],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_get_subsystems",
    },
    Cmd {
        name: "nvmf_create_subsystem",
        help: "Create an NVMe-oF subsystem",
        pos: &[NQN],
        opts: &[
            TGT_T,
            o("-s", "--serial-number", "serial_number", Str, "Serial number of the virtual NVMe controller"),
            o("-d", "--model-number", "model_number", Str, "Model number of the virtual NVMe controller"),
            o("-a", "--allow-any-host", "allow_any_host", True, "Allow any host to connect (default: enforce allowed host NQN list)"),
            o("-m", "--max-namespaces", "max_namespaces", Int, "Maximum number of namespaces"),
            o("-r", "--ana-reporting", "ana_reporting", True, "Enable ANA reporting (ANA log page, ANA Change events, per-listener ANA states)"),
            o("-i", "--min-cntlid", "min_cntlid", Int, "Minimum controller ID"),
            o("-I", "--max-cntlid", "max_cntlid", Int, "Maximum controller ID"),
            o("", "--dmrsl", "dmrsl", Int, "(accepted, ignored)"),
            o("", "--wzsl", "wzsl", Int, "(accepted, ignored)"),
            o("-p", "--passthrough", "passthrough", True, "(accepted, ignored)"),
            o("-n", "--enable-nssr", "enable_nssr", True, "(accepted, ignored)"),
            o("", "--admin-label", "admin_label", Str, "(accepted, ignored)"),
        ],
        build: plain,
        example: "nvmf rpc nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -a -s SPDK00000000000001 -d SPDK_Controller1",
    },
    Cmd {
        name: "nvmf_delete_subsystem",
        help: "Delete an NVMe-oF subsystem (its controllers are disconnected)",
        pos: &[NQN],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_delete_subsystem nqn.2016-06.io.spdk:cnode1",
    },
    Cmd {
        name: "nvmf_subsystem_add_listener",
        help: "Add a listener to an NVMe-oF subsystem ('discovery' = the discovery NQN)",
        pos: &[NQN],
        opts: &[
            req(o("-t", "--trtype", "trtype", Str, "NVMe-oF transport type: tcp, rdma")),
            req(o("-a", "--traddr", "traddr", Str, "NVMe-oF transport address: an IP address")),
            TGT_P,
            o("-f", "--adrfam", "adrfam", Str, "Address family: ipv4, ipv6"),
            o("-s", "--trsvcid", "trsvcid", Str, "Transport service id: the port (rdma: default 4420)"),
            o("-k", "--secure-channel", "secure_channel", True, "Require TLS 1.3 with a PSK on this address (hosts need --psk keys; TCP only)"),
            choices(o("-n", "--ana-state", "ana_state", Str, "ANA state of every group through this listener (default optimized)"), &["optimized", "non_optimized", "inaccessible", "persistent_loss", "change"]),
            o("-S", "--sock-impl", "sock_impl", Str, "(accepted, ignored)"),
            o("", "--numa-id", "numa_id", Int, "(accepted, ignored)"),
        ],
        build: listener,
        example: "nvmf rpc nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t tcp -a 127.0.0.1 -s 4420",
    },
    Cmd {
        name: "nvmf_subsystem_remove_listener",
        help: "Remove a listener from an NVMe-oF subsystem ('discovery' = the discovery NQN)",
        pos: &[NQN],
        opts: &[
            req(o("-t", "--trtype", "trtype", Str, "NVMe-oF transport type: tcp, rdma")),
            req(o("-a", "--traddr", "traddr", Str, "NVMe-oF transport address: an IP address")),
            TGT_P,
            o("-f", "--adrfam", "adrfam", Str, "Address family: ipv4, ipv6"),
            o("-s", "--trsvcid", "trsvcid", Str, "Transport service id: the port (rdma: default 4420)"),
        ],
        build: listener,
        example: "nvmf rpc nvmf_subsystem_remove_listener nqn.2016-06.io.spdk:cnode1 -t tcp -a 127.0.0.1 -s 4420",
    },
    Cmd {
        name: "nvmf_subsystem_add_ns",
        help: "Add a namespace to an NVMe-oF subsystem; prints the NSID",
        pos: &[NQN, p("bdev_name", Str, "Name of the bdev to expose as a namespace")],
        opts: &[
            TGT_T,
            o("-p", "--ptpl-file", "ptpl_file", Str, "File where the namespace's reservation persists through power loss (PTPL); read at start"),
            o("-n", "--nsid", "nsid", Int, "Namespace ID (default: lowest free)"),
            o("-g", "--nguid", "nguid", Str, "16-byte NGUID in hexadecimal"),
            o("-e", "--eui64", "eui64", Str, "8-byte EUI-64 in hexadecimal"),
            o("-u", "--uuid", "uuid", Str, "RFC 4122 UUID"),
            o("-a", "--anagrpid", "anagrpid", Int, "ANA group ID (default: the NSID)"),
            o("-i", "--no-auto-visible", "no_auto_visible", True, "Visible to no host until nvmf_ns_add_host names one (per-host visibility)"),
            o("-N", "--hide-metadata", "hide_metadata", True, "(accepted, ignored)"),
        ],
        build: add_ns,
        example: "nvmf rpc nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0",
    },
    Cmd {
        name: "nvmf_subsystem_listener_set_ana_state",
        help: "Set the ANA state of a listener for one ANA group or all of them; connected hosts get an ANA Change event",
        pos: &[NQN],
        opts: &[
            req(choices(o("-n", "--ana-state", "ana_state", Str, "ANA state to set"), &["optimized", "non_optimized", "inaccessible", "persistent_loss", "change"])),
            req(o("-t", "--trtype", "trtype", Str, "NVMe-oF transport type: tcp, rdma")),
            req(o("-a", "--traddr", "traddr", Str, "NVMe-oF transport address: an IP address")),
            TGT_P,
            o("-f", "--adrfam", "adrfam", Str, "Address family: ipv4, ipv6"),
            o("-s", "--trsvcid", "trsvcid", Str, "Transport service id: the port (rdma: default 4420)"),
            o("-g", "--anagrpid", "anagrpid", Int, "ANA group ID (default: every group)"),
        ],
        build: listener,
        example: "nvmf rpc nvmf_subsystem_listener_set_ana_state nqn.2016-06.io.spdk:cnode1 -n inaccessible -t tcp -a 127.0.0.1 -s 4420 -g 1",
    },
    Cmd {
        name: "nvmf_subsystem_set_ns_ana_group",
        help: "Move a namespace to another ANA group; connected hosts get an ANA Change event",
        pos: &[NQN, p("nsid", Int, "Namespace ID"), p("anagrpid", Int, "ANA group ID")],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_set_ns_ana_group nqn.2016-06.io.spdk:cnode1 1 2",
    },
    Cmd {
        name: "nvmf_ns_add_host",
        help: "Make a namespace added with --no-auto-visible visible to a host; its connected controllers get a Namespace Attribute Changed event",
        pos: &[NQN, p("nsid", Int, "Namespace ID"), p("host", Str, "Host NQN")],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_ns_add_host nqn.2016-06.io.spdk:cnode1 1 nqn.2014-08.org.nvmexpress:uuid:...",
    },
    Cmd {
        name: "nvmf_ns_remove_host",
        help: "Make a namespace added with --no-auto-visible invisible to a host again; its connected controllers get a Namespace Attribute Changed event and new I/O to it gets Invalid Namespace",
        pos: &[NQN, p("nsid", Int, "Namespace ID"), p("host", Str, "Host NQN")],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_ns_remove_host nqn.2016-06.io.spdk:cnode1 1 nqn.2014-08.org.nvmexpress:uuid:...",
    },
    Cmd {
        name: "nvmf_ns_get_reservation",
        help: "Display a namespace's NVMe reservation: generation, type, holder, registrants (host ID, key) and PTPL (nvmfd's own method)",
        pos: &[NQN, p("nsid", Int, "Namespace ID")],
        opts: &[],
        build: plain,
        example: "nvmf rpc nvmf_ns_get_reservation nqn.2016-06.io.spdk:cnode1 1",
    },
    Cmd {
        name: "nvmf_gateway_group_status",
        help: "Show a gateway group as this member sees it: members, leases, ANA group owners, epoch, fencings (nvmfd's own method; also `nvmf gw status`)",
        pos: &[],
        opts: &[],
        build: plain,
        example: "nvmf rpc nvmf_gateway_group_status",
    },
    Cmd {
        name: "nvmf_gateway_group_move",
        help: "Move an ANA group of a gateway group to another member, planned (nvmfd's own method; also `nvmf gw move`)",
        pos: &[p("anagrpid", Int, "ANA group ID"), p("to", Str, "Member ID that should own it")],
        opts: &[],
        build: plain,
        example: "nvmf rpc nvmf_gateway_group_move 2 gw3",
    },
    Cmd {
        name: "nvmf_subsystem_remove_ns",
        help: "Remove a namespace from an NVMe-oF subsystem",
        pos: &[NQN, p("nsid", Int, "Namespace ID")],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_remove_ns nqn.2016-06.io.spdk:cnode1 1",
    },
    Cmd {
        name: "nvmf_subsystem_add_host",
        help: "Add a host NQN to the allowed list of a subsystem",
        pos: &[NQN, p("host", Str, "Host NQN to allow")],
        opts: &[
            TGT_T,
            o("", "--psk", "psk", Str, "Keyring key (keyring_file_add_key) holding the host's TLS PSK, NVMeTLSkey-1:xx:...:"),
            o("", "--dhchap-key", "dhchap_key", Str, "Name of the DH-HMAC-CHAP key (keyring) the host must authenticate with"),
            o("", "--dhchap-ctrlr-key", "dhchap_ctrlr_key", Str, "Name of the DH-HMAC-CHAP controller key (keyring): bidirectional authentication"),
        ],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_add_host nqn.2016-06.io.spdk:cnode1 nqn.2014-08.org.nvmexpress:uuid:... --dhchap-key key0",
    },
    Cmd {
        name: "nvmf_subsystem_set_keys",
        help: "Set (or, with neither option, clear) the DH-HMAC-CHAP keys of an allowed host; the next (re-)authentication uses them",
        pos: &[NQN, p("host", Str, "Host NQN")],
        opts: &[
            TGT_T,
            o("", "--dhchap-key", "dhchap_key", Str, "Name of the DH-HMAC-CHAP key (keyring)"),
            o("", "--dhchap-ctrlr-key", "dhchap_ctrlr_key", Str, "Name of the DH-HMAC-CHAP controller key (keyring)"),
        ],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_set_keys nqn.2016-06.io.spdk:cnode1 nqn.2014-08.org.nvmexpress:uuid:... --dhchap-key key1",
    },
    Cmd {
        name: "keyring_file_add_key",
        help: "Add a key to the file keyring (the file must be readable by its owner only)",
        pos: &[p("name", Str, "Name of the key"), p("path", Str, "Absolute path of the key file")],
        opts: &[],
        build: plain,
        example: "nvmf rpc keyring_file_add_key key0 /etc/nvmfd/keys/key0",
    },
    Cmd {
        name: "keyring_file_remove_key",
        help: "Remove a key from the file keyring (refused while a host uses it)",
        pos: &[p("name", Str, "Name of the key")],
        opts: &[],
        build: plain,
        example: "nvmf rpc keyring_file_remove_key key0",
    },
    Cmd {
        name: "keyring_get_keys",
        help: "List the keyring's keys (names and files; never the keys)",
        pos: &[],
        opts: &[],
        build: plain,
        example: "nvmf rpc keyring_get_keys",
    },
    Cmd {
        name: "nvmf_set_config",
        help: "Set target options; nvmfd acts on the DH-HMAC-CHAP lists",
        pos: &[],
        opts: &[
            o("", "--dhchap-digests", "dhchap_digests", List, "Comma-separated list of allowed DH-HMAC-CHAP digests (sha256, sha384, sha512)"),
            o("", "--dhchap-dhgroups", "dhchap_dhgroups", List, "Comma-separated list of allowed DH-HMAC-CHAP DH groups (null, ffdhe2048 .. ffdhe8192)"),
        ],
        build: plain,
        example: "nvmf rpc nvmf_set_config --dhchap-digests sha256,sha512 --dhchap-dhgroups null,ffdhe2048",
    },
    Cmd {
        name: "nvmf_subsystem_remove_host",
        help: "Remove a host NQN from the allowed list of a subsystem",
        pos: &[NQN, p("host", Str, "Host NQN to remove")],
        opts: &[
            TGT_T,
            o("-T", "--timeout-ms", "timeout_ms", Int, "(accepted, ignored)"),
        ],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_remove_host nqn.2016-06.io.spdk:cnode1 nqn.2014-08.org.nvmexpress:uuid:...",
    },
    Cmd {
        name: "nvmf_subsystem_allow_any_host",
        help: "Allow any host to connect (--allow-any-host) or enforce the host list (--no-allow-any-host)",
        pos: &[NQN],
        opts: &[
            o("", "--allow-any-host", "allow_any_host", BoolOpt, "true: any host; --no-allow-any-host: enforce the allowed host list"),
            o("-e", "--enable", "enable", True, "Older rpc.py spelling of --allow-any-host"),
            o("-d", "--disable", "disable", True, "Older rpc.py spelling of --no-allow-any-host"),
            TGT_T,
        ],
        build: allow_any_host,
        example: "nvmf rpc nvmf_subsystem_allow_any_host nqn.2016-06.io.spdk:cnode1 --allow-any-host",
    },
    Cmd {
        name: "nvmf_subsystem_get_controllers",
        help: "Display controllers of an NVMe-oF subsystem",
        pos: &[NQN],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_get_controllers nqn.2016-06.io.spdk:cnode1",
    },
    Cmd {
        name: "nvmf_subsystem_get_qpairs",
        help: "Display queue pairs of an NVMe-oF subsystem",
        pos: &[NQN],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_get_qpairs nqn.2016-06.io.spdk:cnode1",
    },
    Cmd {
        name: "nvmf_subsystem_get_listeners",
        help: "Display listeners of an NVMe-oF subsystem",
        pos: &[NQN],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_subsystem_get_listeners nqn.2016-06.io.spdk:cnode1",
    },
    Cmd {
        name: "nvmf_get_stats",
        help: "Display current statistics of the target",
        pos: &[],
        opts: &[TGT_T],
        build: plain,
        example: "nvmf rpc nvmf_get_stats",
    },
    Cmd {
        name: "framework_get_reactors",
        help: "Display each reactor: its CPU (lcore), busy and idle ticks, and its thread",
        pos: &[],
        opts: &[],
        build: plain,
        example: "nvmf rpc framework_get_reactors",
    },
    Cmd {
        name: "thread_get_stats",
        help: "Display busy and idle time of each reactor (ticks of tick_rate per second)",
        pos: &[],
        opts: &[],
        build: plain,
        example: "nvmf rpc thread_get_stats",
    },
    Cmd {
        name: "nvmf_get_path_stats",
        help: "Display counters and latency histograms per path (subsystem, listener, host, controller) and namespace (nvmfd only)",
        pos: &[],
        opts: &[],
        build: plain,
        example: "nvmf rpc nvmf_get_path_stats",
    },
];

/// Parameters as rpc.py sends them: every option that has a value.
fn plain(m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    Ok(m)
}

fn num_blocks(m: &mut Map<String, Value>) -> Result<(), String> {
    let size = m
        .remove("total_size")
        .and_then(|v| v.as_f64())
        .unwrap_or(0.0);
    let bs = m.get("block_size").and_then(Value::as_i64).unwrap_or(0);
    if bs <= 0 {
        return Err("block_size must be greater than 0".into());
    }
    let n = ((size * 1024.0 * 1024.0) / bs as f64).floor();
    if n < 0.0 {
        return Err("total_size must not be negative".into());
    }
    m.insert("num_blocks".into(), json!(n as u64));
    Ok(())
}

fn malloc_create(mut m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    num_blocks(&mut m)?;
    Ok(m)
}

fn null_create(mut m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    if m.get("dif_type").and_then(Value::as_i64).unwrap_or(0) != 0
        && m.get("md_size").and_then(Value::as_i64).unwrap_or(0) == 0
    {
        return Err("--md-size must be > 0 when --dif-type is > 0".into());
    }
    num_blocks(&mut m)?;
    Ok(m)
}

fn check_list(
    m: &Map<String, Value>,
    key: &str,
    allowed: &[&str],
) -> Result<Option<Value>, String> {
    let Some(Value::Array(items)) = m.get(key) else {
        return Ok(None);
    };
    let names: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
    let bad: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n != "all" && !allowed.contains(n))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "invalid {key}: '{}'; available: all, {}",
            bad.join(", "),
            allowed.join(", ")
        ));
    }
    Ok(Some(if names.contains(&"all") {
        json!(allowed)
    } else {
        json!(names)
    }))
}

fn create_transport(mut m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    for (key, allowed) in [("masked_oncs", ONCS), ("masked_fuses", FUSES)] {
        match check_list(&m, key, allowed)? {
            Some(v) if v.as_array().is_some_and(|a| !a.is_empty()) => {
                m.insert(key.into(), v);
            }
            _ => {
                m.remove(key);
            }
        }
    }
    Ok(m)
}

fn discovery_shortcut(m: &mut Map<String, Value>) {
    if m.get("nqn").and_then(Value::as_str) == Some("discovery") {
        m.insert("nqn".into(), json!(nvmf_config::DISCOVERY_NQN));
    }
}

fn group_as(m: &mut Map<String, Value>, name: &str, keys: &[&str]) {
    let mut group = Map::new();
    for k in keys {
        if let Some(v) = m.remove(*k) {
            group.insert((*k).to_string(), v);
        }
    }
    if !group.is_empty() {
        m.insert(name.to_string(), Value::Object(group));
    }
}

fn listener(mut m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    group_as(
        &mut m,
        "listen_address",
        &["trtype", "traddr", "trsvcid", "adrfam"],
    );
    discovery_shortcut(&mut m);
    Ok(m)
}

fn add_ns(mut m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    group_as(
        &mut m,
        "namespace",
        &[
            "bdev_name",
            "ptpl_file",
            "nsid",
            "nguid",
            "eui64",
            "uuid",
            "anagrpid",
            "no_auto_visible",
            "hide_metadata",
        ],
    );
    Ok(m)
}

fn allow_any_host(mut m: Map<String, Value>) -> Result<Map<String, Value>, String> {
    // The clap group "allow" has let exactly one of the four spellings through.
    let enable = m.remove("enable") == Some(json!(true));
    let disable = m.remove("disable") == Some(json!(true));
    if enable || disable {
        m.insert("allow_any_host".into(), json!(enable));
    }
    Ok(m)
}

/// Global options (before the method), rpc.py's.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Globals {
    /// RPC Unix socket path
    #[arg(short, long, value_name = "SOCKET", default_value = DEFAULT_RPC_SOCKET)]
    pub server: String,
    /// Seconds to wait for a response (0.001 to 86400)
    #[arg(short, long, default_value_t = 60.0, value_parser = parse_timeout)]
    pub timeout: f64,
    /// Retry connecting RETRIES times, 0.2 s apart
    #[arg(
        short = 'r',
        long = "conn-retries",
        value_name = "RETRIES",
        default_value_t = 0
    )]
    pub retries: u32,
    /// Print the request instead of sending it
    #[arg(long)]
    pub dry_run: bool,
}

impl Default for Globals {
    fn default() -> Self {
        Globals {
            server: DEFAULT_RPC_SOCKET.to_string(),
            timeout: 60.0,
            retries: 0,
            dry_run: false,
        }
    }
}

/// The top level of `nvmf rpc`: the globals and rpc.py's options that
/// nvmfd accepts and ignores; the methods are added as subcommands.
/// `args_override_self` (argparse: a repeated option keeps its last value)
/// and the explicit `-h/--help` reach every method too.
#[derive(clap::Parser)]
#[command(
    name = "nvmf rpc",
    bin_name = "nvmf rpc",
    no_binary_name = true,
    color = ColorChoice::Never,
    term_width = 0,
    about = ABOUT,
    after_help = TYPICAL_SETUP,
    subcommand_required = true,
    subcommand_value_name = "METHOD",
    subcommand_help_heading = "Methods",
    disable_help_subcommand = true,
    disable_help_flag = true,
    args_override_self = true,
    next_help_heading = "Global options (before METHOD)"
)]
struct TopLevel {
    /// This help; `nvmf rpc METHOD -h` explains one method
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
    #[command(flatten)]
    globals: Globals,
    /// Accepted for rpc.py compatibility, ignored (Unix socket only)
    #[arg(short, long, value_name = "PORT")]
    port: Option<String>,
    /// Accepted for rpc.py compatibility, ignored
    #[arg(long, value_name = "LEVEL")]
    verbose: Option<String>,
    /// Accepted for rpc.py compatibility, ignored
    #[arg(short = 'v')]
    v: bool,
}

const ABOUT: &str = "\
Configure a running nvmfd over its JSON-RPC socket, one call at a time, with
the same methods, arguments and flags as SPDK's scripts/rpc.py (scripts
written for rpc.py work with `nvmf rpc` in its place, and rpc.py itself can
talk to nvmfd). The result is printed as JSON (a string result bare, like
rpc.py); errors go to stderr and the exit status is 1 (2: bad command line).";

const TYPICAL_SETUP: &str = "\
a typical setup (what SPDK's NVMe/TCP quick start does):
  nvmf rpc nvmf_create_transport -t TCP -u 8192 -i 131072 -c 8192
  nvmf rpc bdev_malloc_create -b Malloc0 512 512
  nvmf rpc nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -a -s SPDK00000000000001 -d SPDK_Controller1
  nvmf rpc nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0
  nvmf rpc nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t tcp -a 127.0.0.1 -s 4420
  nvmf rpc save_config > nvmfd.json      # later: nvmfd -c nvmfd.json, or load_config < nvmfd.json";

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    /// Print this help text and exit 0.
    Help(String),
    /// Call `method` with `params` (None: no params member).
    Call {
        globals: Globals,
        method: String,
        params: Option<Value>,
        /// Client-side options of save_config / load_config (indent,
        /// subsystems, json_conf, ...), not sent.
        local: Map<String, Value>,
    },
}

/// Every method as a clap subcommand: rpc.py's positionals and flags, help
/// texts, choices and required options, with an example after the help.
fn method_command(c: &Cmd) -> Command {
    let mut cmd = Command::new(c.name)
        .about(c.help)
        .after_help(format!("example:\n  {}", c.example));
    for p in c.pos {
        let arg = Arg::new(p.dest)
            .value_name(p.dest.to_uppercase())
            .required(!p.optional)
            .help(p.help);
        cmd = cmd.arg(with_value(arg, p.kind, &[]));
    }
    for o in c.opts {
        let mut arg = Arg::new(o.dest)
            .long(&o.long[2..])
            .help(o.help)
            .required(o.required);
        if let Some(short) = o.short.strip_prefix('-').and_then(|s| s.chars().next()) {
            arg = arg.short(short);
        }
        cmd = match o.kind {
            True => cmd.arg(arg.action(ArgAction::SetTrue)),
            False => cmd.arg(arg.action(ArgAction::SetFalse)),
            KeyValue => cmd.arg(
                arg.value_name("KEY=VALUE")
                    .action(ArgAction::Append)
                    .value_parser(|s: &str| match s.split_once('=') {
                        Some((k, v)) if !k.is_empty() => Ok(json!([k, v])),
                        _ => Err(format!("{s} not in key=value form")),
                    }),
            ),
            BoolOpt => {
                let no = format!("no_{}", o.dest);
                let negated = Arg::new(no.clone())
                    .long(format!("no-{}", &o.long[2..]))
                    .action(ArgAction::SetTrue)
                    .overrides_with(o.dest)
                    .help(format!("Opposite of {}", o.long));
                cmd.arg(arg.action(ArgAction::SetTrue).overrides_with(no))
                    .arg(negated)
            }
            kind => cmd.arg(with_value(
                arg.value_name(o.dest.to_uppercase()),
                kind,
                o.choices,
            )),
        };
    }
    // The top level's explicit -h/--help turns clap's own off everywhere.
    cmd = cmd.arg(
        Arg::new("help")
            .short('h')
            .long("help")
            .action(ArgAction::Help)
            .help("This help"),
    );
    if c.name == "nvmf_subsystem_allow_any_host" {
        // rpc.py: exactly one of the four spellings.
        cmd = cmd.group(
            ArgGroup::new("allow")
                .args(["allow_any_host", "no_allow_any_host", "enable", "disable"])
                .required(true),
        );
    }
    cmd
}

/// An argument that takes one value, parsed to its JSON form by kind.
fn with_value(arg: Arg, kind: Kind, choices: &'static [&'static str]) -> Arg {
    let arg = arg.action(ArgAction::Set).allow_negative_numbers(true);
    let names = choices.iter().copied();
    match (kind, choices.is_empty()) {
        (Str, true) => arg.value_parser(|s: &str| Ok::<_, String>(Value::from(s))),
        (Str, false) => arg.value_parser(PossibleValuesParser::new(names).map(Value::from)),
        (Int, true) => arg.value_parser(value_parser!(i64).map(Value::from)),
        // Integer choices: every name in the table is an integer.
        (Int, false) => {
            arg.value_parser(PossibleValuesParser::new(names).map(|s| json!(s.parse::<i64>().ok())))
        }
        (Float, _) => arg.value_parser(|s: &str| {
            s.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Value::from)
                .ok_or_else(|| "not a finite number".to_string())
        }),
        (List, _) => {
            arg.value_parser(|s: &str| Ok::<_, String>(json!(s.split(',').collect::<Vec<_>>())))
        }
        (True | False | BoolOpt | KeyValue, _) => {
            unreachable!("flags take no value; key=value options append")
        }
    }
}

fn parse_timeout(s: &str) -> Result<f64, String> {
    s.parse()
        .ok()
        .filter(|t: &f64| (0.001..=86_400.0).contains(t))
        .ok_or_else(|| "seconds, 0.001 to 86400".to_string())
}

/// The whole `nvmf rpc` command line: rpc.py's global options, then one
/// subcommand per method.
fn command() -> Command {
    TopLevel::command().subcommands(COMMANDS.iter().map(method_command))
}

/// The top-level `nvmf rpc --help` text.
pub fn main_help() -> String {
    command().render_help().to_string()
}

/// The parameters a method's matches stand for, before its `build` step:
/// every flag, and every option or positional that was given.
fn collect(c: &Cmd, m: &ArgMatches) -> Map<String, Value> {
    let mut out = Map::new();
    for p in c.pos {
        if let Some(v) = m.get_one::<Value>(p.dest) {
            out.insert(p.dest.into(), v.clone());
        }
    }
    for o in c.opts {
        let v = match o.kind {
            True | False => Some(json!(m.get_flag(o.dest))),
            // --x and --no-x override each other: at most one is set.
            BoolOpt if m.get_flag(o.dest) => Some(json!(true)),
            BoolOpt if m.get_flag(&format!("no_{}", o.dest)) => Some(json!(false)),
            BoolOpt => None,
            KeyValue => m.get_many::<Value>(o.dest).map(|pairs| {
                let obj: Map<String, Value> = pairs
                    .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].clone())))
                    .collect();
                Value::Object(obj)
            }),
            _ => m.get_one::<Value>(o.dest).cloned(),
        };
        if let Some(v) = v {
            out.insert(o.dest.into(), v);
        }
    }
    out
}

/// Parses the words after `nvmf rpc`. Errors are clap's rendered messages
/// (they name the bad option or value and end with the usage line).
pub fn parse_args(args: &[String]) -> Result<Invocation, String> {
    let mut cli = command();
    let matches = match cli.try_get_matches_from_mut(args) {
        Ok(m) => m,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp) => {
            return Ok(Invocation::Help(e.to_string().trim_end().to_string()))
        }
        Err(e) => return Err(e.to_string().trim_end().to_string()),
    };
    let globals = Globals::from_arg_matches(&matches).map_err(|e| e.to_string())?;
    let (name, sub) = matches.subcommand().expect("subcommand_required");
    let cmd = COMMANDS
        .iter()
        .find(|c| c.name == name)
        .expect("subcommands come from COMMANDS");
    let m = (cmd.build)(collect(cmd, sub)).map_err(|e| {
        let sub_cmd = cli.find_subcommand_mut(name).expect("parsed above");
        let e = sub_cmd.error(ErrorKind::ValueValidation, e).to_string();
        e.trim_end().to_string()
    })?;
    let (params, local) = match cmd.name {
        "save_config" | "load_config" => (None, m),
        _ => ((!m.is_empty()).then_some(Value::Object(m)), Map::new()),
    };
    Ok(Invocation::Call {
        globals,
        method: cmd.name.to_string(),
        params,
        local,
    })
}

/// rpc.py's output: a string bare, anything else as JSON with 2-space indent.
pub fn format_result(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

fn to_json_indent(v: &Value, indent: i64) -> String {
    if indent < 0 {
        return v.to_string();
    }
    let ind = " ".repeat(indent as usize);
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(ind.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    serde::Serialize::serialize(v, &mut ser).expect("serializing a Value cannot fail");
    String::from_utf8(out).expect("JSON is UTF-8")
}

fn save_config(client: &mut RpcClient, local: &Map<String, Value>) -> Result<String, String> {
    let err = |e: ClientError| e.to_string();
    let subsystems = client.call("framework_get_subsystems", None).map_err(err)?;
    let list = subsystems
        .as_array()
        .ok_or("framework_get_subsystems did not return an array")?;
    let mut wanted: Option<Vec<String>> = None;
    if let Some(sel) = local.get("subsystems").and_then(Value::as_str) {
        let mut set: Vec<String> = Vec::new();
        let mut todo: Vec<String> = sel.split(',').map(str::to_string).collect();
        while let Some(name) = todo.pop() {
            if set.contains(&name) {
                continue;
            }
            let entry = list
                .iter()
                .find(|e| e["subsystem"] == name.as_str())
                .ok_or_else(|| format!("save_config: no subsystem \"{name}\""))?;
            if let Some(deps) = entry["depends_on"].as_array() {
                todo.extend(deps.iter().filter_map(Value::as_str).map(str::to_string));
            }
            set.push(name);
        }
        wanted = Some(set);
    }
    let with_batches = local.get("with_batches").cloned().unwrap_or(json!(false));
    let mut out = Vec::new();
    for e in list {
        let Some(name) = e["subsystem"].as_str() else {
            continue;
        };
        if wanted
            .as_ref()
            .is_some_and(|w| !w.iter().any(|n| n == name))
        {
            continue;
        }
        let config = client
            .call(
                "framework_get_config",
                Some(&json!({ "name": name, "with_batches": with_batches })),
            )
            .map_err(err)?;
        out.push(json!({ "subsystem": name, "config": config }));
    }
    let indent = local.get("indent").and_then(Value::as_i64).unwrap_or(2);
    Ok(to_json_indent(&json!({ "subsystems": out }), indent))
}

fn read_config_doc(local: &Map<String, Value>) -> Result<Value, String> {
    let text = match local.get("json_conf").and_then(Value::as_str) {
        Some(j) if std::path::Path::new(j).exists() => {
            std::fs::read_to_string(j).map_err(|e| format!("load_config: cannot read {j}: {e}"))?
        }
        Some(j) => j.to_string(),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| format!("load_config: cannot read stdin: {e}"))?;
            s
        }
    };
    serde_json::from_str(&text).map_err(|e| format!("load_config: the input is not JSON: {e}"))
}

/// Calls each `{method, params}` entry of a save_config document, in order
/// (rpc.py's way; for servers without nvmfd's `load_config`).
fn load_config_per_entry(client: &mut RpcClient, doc: &Value) -> Result<(), String> {
    fn walk(v: &Value, out: &mut Vec<Value>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            other => out.push(other.clone()),
        }
    }
    let sections = doc["subsystems"]
        .as_array()
        .ok_or("load_config: missing \"subsystems\" array")?;
    for s in sections {
        let mut entries = Vec::new();
        walk(&s["config"], &mut entries);
        for e in entries {
            let method = e["method"]
                .as_str()
                .ok_or("load_config: an entry without \"method\"")?;
            let params = e.get("params").filter(|p| !p.is_null());
            client
                .call(method, params)
                .map_err(|err| format!("{method}: {err}"))?;
        }
    }
    Ok(())
}

fn run(inv: Invocation) -> Result<Option<String>, String> {
    let (globals, method, params, local) = match inv {
        Invocation::Help(h) => return Ok(Some(h)),
        Invocation::Call {
            globals,
            method,
            params,
            local,
        } => (globals, method, params, local),
    };
    let params = if method == "load_config" {
        Some(read_config_doc(&local)?)
    } else {
        params
    };
    if globals.dry_run {
        let req = RpcClient::request(1, &method, params.as_ref());
        return Ok(Some(format!(
            "Request:\n{}",
            serde_json::to_string_pretty(&req).unwrap_or_default()
        )));
    }
    let mut client =
        RpcClient::connect(&globals.server, globals.retries).map_err(|e| e.to_string())?;
    client
        .set_timeout(Some(Duration::from_secs_f64(globals.timeout)))
        .map_err(|e| e.to_string())?;
    match method.as_str() {
        "save_config" => save_config(&mut client, &local).map(Some),
        "load_config" => {
            let doc = params.expect("read above");
            match client.call("load_config", Some(&doc)) {
                Ok(_) => Ok(None),
                Err(ClientError::Rpc(e)) if e.code == METHOD_NOT_FOUND => {
                    load_config_per_entry(&mut client, &doc).map(|_| None)
                }
                Err(e) => Err(format!("load_config: {e}")),
            }
        }
        _ => match client.call(&method, params.as_ref()) {
            Ok(v) => Ok(Some(format_result(&v))),
            Err(ClientError::Rpc(e)) => {
                let req = params.unwrap_or(json!({}));
                Err(format!(
                    "request:\n{}\nGot JSON-RPC error response\nresponse:\n{}",
                    serde_json::to_string_pretty(&json!({ "method": method, "params": req }))
                        .unwrap_or_default(),
                    serde_json::to_string_pretty(&e.to_json()).unwrap_or_default()
                ))
            }
            Err(e) => Err(format!("{method}: {e}")),
        },
    }
}

/// Entry point of `nvmf rpc METHOD [ARGS]`; `args` are the words after `rpc`.
/// Returns the process exit code (0 success, 1 RPC or connection error,
/// 2 bad command line).
pub fn cli_main(args: &[String]) -> i32 {
    let inv = match parse_args(args) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    match run(inv) {
        Ok(Some(out)) => {
            // A closed pipe (`nvmf rpc --help | head`) is no reason to panic.
            let _ = writeln!(std::io::stdout().lock(), "{out}");
            0
        }
        Ok(None) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks over every method of the table
    /// (duplicate short or long spellings, bad groups, ...); parsing only
    /// builds the method it meets.
    #[test]
    fn every_method_is_a_valid_clap_command() {
        super::command().debug_assert();
    }
}
