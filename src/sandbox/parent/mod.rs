//! The parent side: the code that runs in the server (or `run`) and starts launchers.
//! [`Runtime`](runtime::Runtime) holds the launch state; `spawn` turns a
//! [`SandboxCommand`](spawn::SandboxCommand) into a launcher (plan → descriptor layout →
//! route → status read); `zygote` is the server's fork helper; `pool` makes cgroups,
//! views and network namespaces ahead of need; `cgroup` and `isolation` make and hold
//! job cgroups; `netns` the broker's namespaces; `proxy` the broker interface; `child`
//! waits for, signals and reports on what was started; `instance` the server's id;
//! `probe` is `doctor`'s view of the kernel. Imports `policy/` and `launcher/`.

pub(crate) mod cgroup;
pub(crate) mod child;
pub(crate) mod error;
pub(crate) mod instance;
pub(crate) mod isolation;
mod memfd;
pub(crate) mod netns;
pub(crate) mod pool;
pub(crate) mod probe;
pub(crate) mod proxy;
pub(crate) mod runtime;
pub(crate) mod spawn;
mod spawner;
pub(crate) mod zygote;
