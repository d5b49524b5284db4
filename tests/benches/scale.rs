//! The scale bench: nodus against a generated cluster in the API-server stand-in.
//!
//! For each shape (services × endpoints per service × nodes) it loads the cluster, starts
//! a real `nodus run`, and reports the time to ready, memory after the initial sync, and a
//! churn of endpoint updates: the wall time from the first API write until nodus has
//! applied the last one, and the time nodus spent applying batches. It prints figures;
//! it asserts nothing.
//!
//! `cargo bench --bench scale -- [--shape 1000x10x100]… [--churn 1000] [--nodus PATH]
//! [--page-size N] [--settle-ms MS] [--dns]`

use anyhow::{Context, bail};
use nodus_testbed::apiserver::{self, ApiServerConfig, Store};
use nodus_testbed::probe::http_get;
use nodus_testbed::scale::{self, ProcMemory, Shape, proc_memory};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Options {
    shapes: Vec<Shape>,
    churn: usize,
    nodus: PathBuf,
    settle: Duration,
    page_size: Option<u32>,
    /// Run with the DNS server on (on an ephemeral port) rather than no subsystem at all.
    dns: bool,
}

fn parse_shape(text: &str) -> anyhow::Result<Shape> {
    let parts: Vec<usize> = text
        .split('x')
        .map(|p| {
            p.parse()
                .with_context(|| format!("shape {text:?}: expected SxExN"))
        })
        .collect::<Result<_, _>>()?;
    let [services, endpoints_per_service, nodes] = parts[..] else {
        bail!("shape {text:?}: expected SxExN");
    };
    Ok(Shape {
        services,
        endpoints_per_service,
        nodes,
    })
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        shapes: Vec::new(),
        churn: 1000,
        nodus: PathBuf::from(env!("CARGO_BIN_EXE_nodus")),
        settle: Duration::from_secs(2),
        page_size: None,
        dns: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--shape" => opts.shapes.push(parse_shape(&value()?)?),
            "--churn" => opts.churn = value()?.parse()?,
            "--nodus" => opts.nodus = value()?.into(),
            "--settle-ms" => opts.settle = Duration::from_millis(value()?.parse()?),
            "--page-size" => opts.page_size = Some(value()?.parse()?),
            "--dns" => opts.dns = true,
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    if opts.shapes.is_empty() {
        opts.shapes = ["100x3x3", "1000x10x100", "10000x10x100"]
            .iter()
            .map(|s| parse_shape(s))
            .collect::<Result<_, _>>()?;
    }
    Ok(opts)
}

struct Row {
    shape: Shape,
    ready: Duration,
    synced: ProcMemory,
    churn_wall: Duration,
    churn_apply: f64,
    churned: ProcMemory,
}

fn metric(body: &str, line_prefix: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill with a pid we own; at worst the process is already gone.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn run_shape(opts: &Options, shape: Shape) -> anyhow::Result<Row> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let store = Store::new(ApiServerConfig {
        history: opts.churn + 10_000,
        ..ApiServerConfig::default()
    });
    for object in scale::cluster(&shape) {
        store.apply_value(object)?;
    }
    let listener = rt.block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))?;
    let server = rt.block_on(apiserver::serve(store.clone(), listener))?;
    let dir = std::env::temp_dir().join(format!("nodus-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    apiserver::write_kubeconfig(&kubeconfig, &server.url())?;
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    let log = std::fs::File::create(dir.join("nodus.log"))?;
    let config = dir.join("config.yaml");
    let mut settings = opts
        .page_size
        .map_or(String::new(), |n| format!("watch_page_size: {n}\n"));
    settings.push_str(&match opts.dns {
        true => format!("dns:\n  listen: [\"127.0.0.1:{}\"]\n", free_port()?),
        false => "dns:\n  enabled: false\n".to_string(),
    });
    std::fs::write(&config, settings)?;

    let start = Instant::now();
    let agent = Agent(
        Command::new(&opts.nodus)
            .args([
                "run",
                "--node-name",
                &scale::node_name(0),
                "--http-addr",
                &http.to_string(),
            ])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--config")
            .arg(&config)
            .env("NODUS_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", opts.nodus.display()))?,
    );
    let pid = agent.0.id();
    let timeout = Duration::from_secs(5);
    loop {
        if http_get(http, "/readyz", timeout).is_ok_and(|(code, _)| code == 200) {
            break;
        }
        if start.elapsed() > Duration::from_secs(600) {
            bail!(
                "nodus not ready after 10 minutes; see {}",
                dir.join("nodus.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = start.elapsed();
    std::thread::sleep(opts.settle);
    let synced = proc_memory(pid)?;

    let metrics = |what: &str| -> anyhow::Result<f64> {
        let (_, body) = http_get(http, "/metrics", timeout)?;
        metric(&body, what).with_context(|| format!("no {what} in /metrics"))
    };
    let endpoints_before = metrics("nodus_view_objects{kind=\"endpoint\"}")?;
    let apply_before = metrics("nodus_view_apply_duration_seconds_sum")?;
    let churn_start = Instant::now();
    for k in 0..opts.churn {
        let i = k % shape.services;
        store.apply_value(scale::slice(i, &shape, k / shape.services + 1))?;
    }
    // A last update adds one endpoint: once nodus counts it, every update before it is in.
    let marker = Shape {
        endpoints_per_service: 1,
        ..shape
    };
    store.apply_value(scale::slice(shape.services, &marker, 0))?;
    loop {
        if metrics("nodus_view_objects{kind=\"endpoint\"}")? > endpoints_before {
            break;
        }
        if churn_start.elapsed() > Duration::from_secs(300) {
            bail!("churn not applied after 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let churn_wall = churn_start.elapsed();
    let churn_apply = metrics("nodus_view_apply_duration_seconds_sum")? - apply_before;
    std::thread::sleep(opts.settle);
    let churned = proc_memory(pid)?;
    drop(agent);
    rt.block_on(server.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Row {
        shape,
        ready,
        synced,
        churn_wall,
        churn_apply,
        churned,
    })
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    println!(
        "nodus scale bench: {} (churn {} endpoint-slice updates; DNS {})",
        opts.nodus.display(),
        opts.churn,
        if opts.dns { "on" } else { "off" }
    );
    println!(
        "{:<14} {:>9} | {:>8} {:>8} {:>8} | {:>10} {:>10} | {:>8} {:>8} {:>8}",
        "shape S×E×N",
        "ready s",
        "RSS MiB",
        "anon",
        "peak",
        "churn ms",
        "apply ms",
        "RSS MiB",
        "anon",
        "peak"
    );
    println!(
        "{:<14} {:>9} | {:^26} | {:^21} | {:^26}",
        "", "", "after initial sync", "churn", "after churn"
    );
    for shape in &opts.shapes {
        let row = run_shape(&opts, *shape)?;
        println!(
            "{:<14} {:>9.2} | {:>8} {:>8} {:>8} | {:>10.1} {:>10.1} | {:>8} {:>8} {:>8}",
            format!(
                "{}×{}×{}",
                row.shape.services, row.shape.endpoints_per_service, row.shape.nodes
            ),
            row.ready.as_secs_f64(),
            mib(row.synced.rss_kib),
            mib(row.synced.anon_kib),
            mib(row.synced.peak_rss_kib),
            row.churn_wall.as_secs_f64() * 1000.0,
            row.churn_apply * 1000.0,
            mib(row.churned.rss_kib),
            mib(row.churned.anon_kib),
            mib(row.churned.peak_rss_kib),
        );
    }
    Ok(())
}
