export { capabilities } from './backend/index.js';
export { inspect, verify } from './process/identity.js';
export { open, spawn, ProcessHandle } from './process/handle.js';
export type { SpawnedHandle, SpawnOptions, StdioOption } from './process/handle.js';
export { terminate } from './process/terminate.js';
export type { StopResult, TerminateOptions, TerminateResult } from './process/terminate.js';
export { parseStat, splitCmdline } from './process/proc.js';
export type { StatFields } from './process/proc.js';
// Named, not `export *`: errors.ts also holds helpers for custody's own modules (errnoError, isErrnoCode).
export {
  AbortError,
  BadCgroupError,
  BadLogError,
  BadManifestError,
  BadPidfileError,
  CgroupTimeoutError,
  ConfirmTimeoutError,
  CustodyError,
  DeferredError,
  ForeignProcError,
  IdentityMismatchError,
  IdentityUnrecordedError,
  InvalidArgError,
  LaunchExitedError,
  NoStateDirError,
  NotAProcessError,
  NotCustodyDirError,
  NotOursError,
  PathRefusedError,
  QuarantinedError,
  ReadyTimeoutError,
  StateIOError,
  StateLockedError,
  StopTimeoutError,
  UnsafePathError,
  UnsupportedError,
} from './errors.js';
export type { CustodyErrorCode } from './errors.js';
export type {
  AfterExitEnd,
  Capabilities,
  CgroupCapabilities,
  ExecCapabilities,
  ExitResult,
  ExitStatus,
  InstanceStopResult,
  LastExit,
  OutputTails,
  ProcessIdentity,
  Verdict,
  VerifyResult,
} from './types.js';
export type { CgroupLimits, CgroupOptions, CgroupUsage } from './process/cgroup.js';
export type { ExecAttributes, RlimitValue, Rlimits, RunAs } from './process/exec-attrs.js';
export type { RlimitName } from './backend/types.js';
export { Supervisor } from './supervisor.js';
export type { InstanceInfo, InstanceStatus, InstanceSummary, StopOptions, SupervisorOptions } from './options.js';
export type { Instance, LaunchSpec, ReadySpec, SocketReady, PidSpec, HealthSpec } from './lifecycle/launch.js';
export type { RestartBudget, RestartOptions, RestartPolicy, RestartWhen } from './lifecycle/restart-policy.js';
export { followLog, logPaths, readLogTail } from './state/logs.js';
export type { LogFiles, LogOptions } from './state/logs.js';
export type { RecoveryReport, RecoveryEntry } from './recovery/host.js';
export type {
  AbandonEvent,
  AdoptEvent,
  CleanEvent,
  ConfirmEvent,
  CustodyEvent,
  CustodyEventOf,
  CustodyEventType,
  EventBase,
  EscalateEvent,
  EventSink,
  ExitEvent,
  FreezeEvent,
  GaveUpEvent,
  InstanceEvent,
  LaunchEvent,
  QuarantineEvent,
  ReadyEvent,
  ReleaseEvent,
  RepairEvent,
  RestartEvent,
  RetryEvent,
  RunningEvent,
  SpawnEvent,
  StatusEvent,
  StopEvent,
  SweepEvent,
  ThawEvent,
  WarningEvent,
  WholeInstanceEvent,
} from './events.js';
export type {
  BackoffManifest,
  FailedManifest,
  Manifest,
  ManifestRestart,
  ManifestState,
  Quarantine,
  QuarantinedManifest,
  RunningManifest,
  StartingManifest,
  StoppingManifest,
} from './state/manifest.js';
export type { TokenMode } from './process/ownership.js';
export { sweep } from './process/sweep.js';
export type { SweepOptions, SweepResult } from './process/sweep.js';
export { descendants, terminateTree } from './process/tree.js';
export type { TreeTerminateOptions, TreeTerminateResult } from './process/tree.js';
