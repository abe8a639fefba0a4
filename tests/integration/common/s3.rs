//! An S3-speaking server for the tests. There is no network here but package registries, so
//! the tests do not reach AWS: they run a stand-in, moto's server (`moto[server]` from PyPI,
//! which `.ci/run` installs into target/tmp/s3-server), which speaks S3's wire protocol
//! (SigV4-signed REST, multipart uploads) on loopback. The test's own changes to the store go
//! through boto3, the AWS SDK for Python, which moto brings.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The credentials every kavi under test gets, as AWS's tools read them: made up, as moto
/// takes any. The secret is long and unusual enough to be found wherever it leaks to.
pub const ACCESS_KEY_ID: &str = "AKIAKAVITESTSTANDIN";
pub const SECRET_ACCESS_KEY: &str = "kavi-test-secret-8Jq2vXw9RtY5uZ3pL7nM4kHs";

/// A running stand-in S3 server, stopped when dropped.
pub struct Server {
    child: Child,
    pub endpoint: String,
    python: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a stand-in S3 server on a free loopback port; `None`, saying why and how to install
/// it, when moto is missing (under CI, a failure).
pub fn server() -> Option<Server> {
    let python = super::python_with("s3-server", "moto[server]>=5,<6", "moto.server")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The module, not the `moto_server` script: the script's first line names the python of
    // the folder the environment was made in, gone once that folder is copied or moved.
    let child = Command::new(&python)
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
        python,
    };
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stand-in S3 server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(server)
}

impl Server {
    /// Runs `script` with boto3's S3 client `s3` on this server, with the test's credentials;
    /// `sys.argv[1:]` are `args`. Panics with its output when it fails.
    pub fn boto3(&self, script: &str, args: &[&str]) -> String {
        let program = format!(
            "import sys, boto3\n\
             s3 = boto3.client('s3', endpoint_url={:?}, region_name='us-east-1',\n\
                 aws_access_key_id={ACCESS_KEY_ID:?}, aws_secret_access_key={SECRET_ACCESS_KEY:?})\n\
             {script}\n",
            self.endpoint
        );
        let output = Command::new(&self.python)
            .arg("-c")
            .arg(program)
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "boto3: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    pub fn create_bucket(&self, bucket: &str) {
        self.boto3("s3.create_bucket(Bucket=sys.argv[1])", &[bucket]);
    }
}
