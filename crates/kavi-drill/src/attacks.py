# The attacks of `kavi drill isolation`, one function each, run as `python3 -I -B - CASE` under
# the confinement of a role. Each prints one JSON line: whether the attack got what it wanted
# ("allowed"), the errno name that stopped it, and a detail. An attack that kills its own
# process (seccomp) prints nothing: kavi reads that from how the process ended. The drill
# passes what it needs in KAVI_DRILL_* variables; every attack is bounded in time and size
# and touches only what the drill made.
import ctypes
import errno
import json
import os
import socket
import sys
import time

ENV = os.environ
libc = ctypes.CDLL(None, use_errno=True)


def refused(err, detail=""):
    name = errno.errorcode.get(err, str(err)) if isinstance(err, int) else err
    return {"allowed": False, "errno": name, "detail": detail}


def allowed(detail):
    return {"allowed": True, "errno": None, "detail": detail}


def read_file(path):
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except OSError as e:
        return refused(e.errno, path)
    return allowed(f"read {len(data)} bytes of {path}")


def syscall(number, *args):
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    return result, ctypes.get_errno()


def home_canary():
    path = ENV["KAVI_DRILL_HOME_CANARY"]
    return read_file(path)


def ssh_key():
    return read_file(os.path.expanduser("~/.ssh/id_rsa"))


def etc_shadow():
    return read_file("/etc/shadow")


def passwd_link():
    # A link in the workspace to the host's list of accounts, read as a note would be.
    import hashlib

    path = ENV["KAVI_DRILL_PASSWD_LINK"]
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as e:
        return refused(e.errno, path)
    if hashlib.sha256(data).hexdigest() == ENV["KAVI_DRILL_PASSWD_SHA256"]:
        return allowed(f"read the host's /etc/passwd through {os.path.basename(path)}")
    return refused("STAND_IN", f"read {len(data)} bytes, not the host's")


def kavi_environ():
    return read_file(f"/proc/{ENV['KAVI_DRILL_KAVI_PID']}/environ")


def ledger():
    try:
        names = os.listdir(ENV["KAVI_DRILL_LEDGER"])
    except OSError as e:
        return refused(e.errno)
    return allowed(f"lists {names}") if names else refused("ENOENT", "the ledger folder is empty")


def workspace_secret():
    errors = []
    for path in ENV["KAVI_DRILL_SECRET"].split("\n"):
        try:
            data = open(path).read()
        except OSError as e:
            errors.append(e.errno)
            continue
        if "kavi-drill-secret" in data:
            return allowed("read " + os.path.basename(path))
    return refused(errors[0] if errors else "ENOENT", "every one hidden")


def ignored_secret():
    path = ENV["KAVI_DRILL_IGNORED"]
    try:
        data = open(path).read()
    except OSError as e:
        return refused(e.errno, path)
    if "kavi-drill-secret" in data:
        return allowed("read " + os.path.basename(path))
    return refused("STAND_IN", f"read {len(data)} characters, not the credential")


def write_policies():
    try:
        with open(ENV["KAVI_DRILL_POLICY"], "a") as f:
            f.write("\n# weakened\n")
    except OSError as e:
        return refused(e.errno)
    return allowed("appended to a policy")


def chmod_policy():
    try:
        os.chmod(ENV["KAVI_DRILL_POLICY"], 0o777)
        os.utime(ENV["KAVI_DRILL_POLICY"], (0, 0))
    except OSError as e:
        return refused(e.errno)
    return allowed("changed a policy's mode and time")


def write_beside():
    try:
        with open(ENV["KAVI_DRILL_BESIDE"], "w") as f:
            f.write("escaped")
    except OSError as e:
        return refused(e.errno)
    return allowed("wrote (the drill checks whether it landed outside)")


def udp_out():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"kavi-drill-udp", ("127.0.0.1", int(ENV["KAVI_DRILL_UDP_PORT"])))
    return allowed("sent (the drill checks whether it arrived)")


def tcp_out():
    s = socket.create_connection(("127.0.0.1", int(ENV["KAVI_DRILL_TCP_PORT"])), timeout=3)
    s.sendall(b"kavi-drill-tcp")
    return allowed("connected")


def mptcp_out():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.settimeout(3)
    s.connect(("127.0.0.1", int(ENV["KAVI_DRILL_TCP_PORT"])))
    return allowed("connected over MPTCP")


def proxy_address():
    from urllib.parse import urlsplit
    proxy = urlsplit(ENV.get("HTTPS_PROXY", ""))
    return proxy.hostname, proxy.port


def proxy_connect():
    import http.client
    host, port = proxy_address()
    if not host:
        return refused("ENOENT", "no proxy in the environment")
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.set_tunnel("127.0.0.1", int(ENV["KAVI_DRILL_TCP_PORT"]))
    try:
        c.connect()
    except OSError as e:
        if "403" in str(e):
            return refused("FORBIDDEN", str(e))
        return refused(e.errno or "ECONNREFUSED", str(e))
    c.sock.sendall(b"kavi-drill-tcp")
    return allowed("tunnelled (the drill checks whether it arrived)")


def proxy_http():
    import http.client
    host, port = proxy_address()
    if not host:
        return refused("ENOENT", "no proxy in the environment")
    c = http.client.HTTPConnection(host, port, timeout=5)
    try:
        c.request("GET", f"http://127.0.0.1:{ENV['KAVI_DRILL_TCP_PORT']}/kavi-drill")
        status = c.getresponse().status
    except OSError as e:
        # Sent and waiting for an answer the drill's listener never gives: it got through.
        return allowed(f"forwarded ({e})")
    if status == 403:
        return refused("FORBIDDEN", "403")
    return allowed(f"forwarded ({status})")


def raw_icmp():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    return allowed("opened a raw socket")


def netlink():
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    except OSError as e:
        return refused(e.errno)
    return allowed("opened a netlink socket")


def unix_connect(address, what):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address)
    except OSError as e:
        return refused(e.errno)
    return allowed("connected to " + what)


def unix_path():
    return unix_connect(ENV["KAVI_DRILL_UNIX"], "the drill's unix socket")


def unix_abstract():
    return unix_connect("\0" + ENV["KAVI_DRILL_ABSTRACT"], "the drill's abstract socket")


def unix_workspace():
    # The view shows the workspace read-only, but connect() to a socket file needs no write.
    return unix_connect(ENV["KAVI_DRILL_UNIX_WORKSPACE"], "a unix socket in the workspace")


def tiocsti():
    import fcntl
    import termios
    for fd in (0, 1, 2):
        try:
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
            return allowed(f"pushed input through fd {fd}")
        except OSError:
            pass
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
    except OSError as e:
        return refused(e.errno, "/dev/tty")
    fcntl.ioctl(tty, termios.TIOCSTI, b"x")
    return allowed("pushed input into /dev/tty")


def daemon():
    token = ENV["KAVI_DRILL_TOKEN"]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            # The token rides in its command line, where the drill looks for survivors.
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)", token])
        os._exit(0)
    os.wait()
    # The builder goes on with its work while the daemon waits for kavi to look away.
    time.sleep(1)
    return allowed("left a daemon (the drill checks whether it outlived the run)")


def child_ended(pid, what):
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signal = os.WTERMSIG(status)
        name = "SIGSYS" if signal == 31 else f"signal {signal}"
        return refused(name, f"the child that tried {what} was killed")
    code = os.WEXITSTATUS(status)
    if code == 0:
        return allowed(f"started {what}")
    return refused(code - 100 if code > 100 else f"exit {code}", what)


def exec_ctypes():
    # A program started by a route no scanner rule names: libc's execv through ctypes, in a
    # child, so that the attack can tell how it ended. The program is the interpreter itself,
    # which every view holds: a refusal cannot be a missing file.
    pid = os.fork()
    if pid == 0:
        path = sys.executable.encode()
        argv = (ctypes.c_char_p * 5)(path, b"-I", b"-c", b"pass", None)
        libc.execv(path, argv)
        os._exit(100 + ctypes.get_errno())
    return child_ended(pid, "execv through ctypes")


def exec_spawn():
    # os.posix_spawn reached by a name built at run time, which a scan of names cannot see.
    spawn = getattr(os, "posix" + "_spawn")
    try:
        pid = spawn(sys.executable, [sys.executable, "-I", "-c", "pass"], {})
    except OSError as e:
        return refused(e.errno, "posix_spawn")
    return child_ended(pid, "posix_spawn")


def exec_loader():
    # The ELF loader run as a program, which maps and runs the program it is handed without an
    # exec of that program: what Landlock's execute right on the interpreter alone would let by.
    with open("/proc/self/maps") as f:
        loader = next((line.split()[-1] for line in f if "/ld-linux" in line or "/ld-musl" in line), None)
    if loader is None:
        return refused("ENOENT", "no ELF loader mapped")
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(loader, [loader, sys.executable, "-I", "-c", "pass"])
        except OSError as e:
            os._exit(100 + e.errno)
    return child_ended(pid, f"{loader} as a program")


def exec_memfd():
    # A program from memory: a copy of the interpreter in a memfd, run by its descriptor
    # (execveat with AT_EMPTY_PATH), no path in the view involved.
    fd = os.memfd_create("kavi-drill")
    with open(sys.executable, "rb") as f:
        os.write(fd, f.read())
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fd, [sys.executable, "-I", "-c", "pass"], {})
        except OSError as e:
            os._exit(100 + e.errno)
    return child_ended(pid, "a program from a memfd")


def exec_self():
    # execv in the skill's own process (os.execv through getattr): the process itself is killed.
    getattr(os, "ex" + "ecv")(sys.executable, [sys.executable, "-I", "-c", "print('{\"allowed\": true, \"errno\": null, \"detail\": \"replaced itself\"}')"])


def kill_outside():
    try:
        os.kill(int(ENV["KAVI_DRILL_VICTIM"]), 9)
    except OSError as e:
        return refused(e.errno)
    return allowed("signalled the drill's process")


def kill_kavi():
    try:
        os.kill(int(ENV["KAVI_DRILL_KAVI_PID"]), 0)
    except OSError as e:
        return refused(e.errno)
    return allowed("can signal kavi")


def init_memory():
    # bubblewrap's init, pid 1 here, is the program's user and dumpable: code written into its
    # memory would outlive the run and report any exit status. Both names of that memory.
    for path in ("/proc/1/mem", "/proc/1/task/1/mem"):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            last = e.errno
            continue
        os.close(fd)
        return allowed(f"opened {path} for writing")
    return refused(last)


def page_cache():
    # The page cache of a file every sandbox shows is shared with the others and with the
    # machine's accounts: evicting its pages and asking which are cached carries bits out.
    fd = os.open(sys.executable, os.O_RDONLY)
    got, last = [], None
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        got.append("evicted the interpreter's pages")
    except OSError as e:
        last = e.errno
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        got.append("asked whether they were cached")
    except OSError as e:
        if e.errno == errno.EAGAIN:
            got.append("asked whether they were cached (not)")
        else:
            last = e.errno
    os.close(fd)
    return allowed(", ".join(got)) if got else refused(last)


def kill_everyone():
    os.kill(-1, 9)
    return allowed("signalled every process it may (kill -9 -1) and lived")


def memory():
    try:
        block = bytearray(4 << 30)
        block[:: 1 << 12] = b"x" * len(block[:: 1 << 12])
    except MemoryError:
        return refused("ENOMEM", "MemoryError")
    return allowed("held 4 GiB")


def processes():
    children = []
    try:
        for _ in range(500):
            pid = os.fork()
            if pid == 0:
                time.sleep(20)
                os._exit(0)
            children.append(pid)
    except OSError as e:
        return refused(e.errno, f"after {len(children)} processes")
    finally:
        # Reaped before the attack ends: children it left to the namespace's init would be a
        # daemon, which the watch may see before the bound is looked at.
        for pid in children:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
    return allowed("started 500 processes")


def big_file():
    fd = os.open(os.path.join(ENV["TMPDIR"], "big"), os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, 3 << 30)
    except OSError as e:
        return refused(e.errno)
    finally:
        os.unlink(os.path.join(ENV["TMPDIR"], "big"))
    return allowed("allocated 3 GiB")


def fill_disk():
    import time
    chunk = b"\0" * (8 << 20)
    try:
        for i in range(64):  # 512 MiB in files under any per-file bound, over 16 seconds
            with open(os.path.join(ENV["TMPDIR"], f"fill{i}"), "wb") as f:
                f.write(chunk)
            time.sleep(0.25)
    except OSError as e:
        return refused(e.errno)
    return allowed("wrote 512 MiB into its folders")


def open_files():
    held = []
    try:
        for _ in range(100_000):
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        return refused(e.errno, f"after {len(held)}")
    return allowed("held 100,000 files open")


def mknod():
    import stat
    try:
        os.mknod(os.path.join(ENV["TMPDIR"], "mem"), stat.S_IFCHR | 0o600, os.makedev(1, 1))
    except OSError as e:
        return refused(e.errno)
    return allowed("made a device node")


def capabilities():
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
            return allowed(f"CapEff {effective:x}") if effective else refused("EPERM", "none")
    return refused("ENOENT", "no CapEff")


def sysctl():
    path = "/proc/sys/kernel/printk_ratelimit_burst"
    try:
        value = open(path).read()
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        return refused(e.errno)
    return allowed("wrote a kernel setting")


def user_namespace():
    result, err = syscall(272, 0x10000000)  # unshare(CLONE_NEWUSER)
    return refused(err) if result != 0 else allowed("made a user namespace")


def io_uring():
    params = ctypes.create_string_buffer(120)
    result, err = syscall(425, 8, ctypes.addressof(params))  # io_uring_setup
    return refused(err) if result < 0 else allowed("made an io_uring")


def keyctl():
    result, err = syscall(250, 0, -3)  # keyctl(GET_KEYRING_ID, SESSION)
    return refused(err) if result < 0 else allowed("reached the kernel keyring")


def inotify():
    result, err = syscall(294, 0)  # inotify_init1(0)
    if result < 0:
        return refused(err)
    os.close(result)
    return allowed("made an inotify instance")


def pty_count():
    # Each pseudo-terminal held open moves a count every account reads.
    try:
        os.openpty()
    except OSError as e:
        return refused(e.errno, "os.openpty")
    return allowed("opened a pseudo-terminal")


def process_name():
    # A name every account reads in the host's /proc: written there, or set with prctl.
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write("leak")
        return allowed("renamed itself through /proc/self/comm")
    except OSError:
        pass
    result, err = syscall(157, 15, ctypes.addressof(ctypes.create_string_buffer(b"leak")), 0, 0, 0)
    return refused(err) if result != 0 else allowed("renamed itself with prctl(PR_SET_NAME)")


def perf_event():
    attr = ctypes.create_string_buffer(128)
    result, err = syscall(298, ctypes.addressof(attr), 0, -1, -1, 0)
    return refused(err) if result < 0 else allowed("opened a performance counter")


def ptrace():
    result, err = syscall(101, 16, 1, 0, 0)  # PTRACE_ATTACH to pid 1
    return refused(err) if result != 0 else allowed("attached to a process")


def forbidden_in_child():
    # The forbidden call made by a child whose death the builder ignores, as `sh -c 'x; true'`
    # would: the builder's own exit says nothing of it.
    pid = os.fork()
    if pid == 0:
        syscall(101, 16, 1, 0, 0)  # PTRACE_ATTACH to pid 1
        os._exit(0)
    os.waitpid(pid, 0)
    return refused("CHILD_KILLED", "the child's status was ignored")


def mount():
    result, err = syscall(165, 0, 0, 0, 0, 0)
    return refused(err) if result != 0 else allowed("mounted")


def bpf():
    result, err = syscall(321, 0, 0, 0)
    return refused(err) if result < 0 else allowed("made a BPF map")


def x32():
    result, err = syscall(0x40000000 | 39)  # getpid through the x32 ABI
    return refused(err) if result < 0 else allowed("made an x32 call")


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()), flush=True)
