/**
 * src/recovery/decide.ts deciders: what recovery does with each manifest, from what was read. Pure functions: no
 * process, no state dir; each case a situation and the decision expected (the effects are the behavioural
 * suites' business: test/recovery/recover.test.ts, test/recovery/cgroup-recovery.test.ts, test/reliability/).
 */
import { describe, expect, it } from 'vitest';
import { BadManifestError } from '../../src/errors.js';
import {
  decideFailure,
  decideManifest,
  decideRunning,
  decideStarting,
  decideStopping,
  decideUnreadable,
  type RunningFacts,
  type StartingFacts,
  type StoppingFacts,
} from '../../src/recovery/decide.js';
import { IncompleteInstanceError, type Manifest } from '../../src/state/manifest.js';
import type { ProcessIdentity } from '../../src/types.js';

const errno = (code: string) => Object.assign(new Error(code), { code });
const identity: ProcessIdentity = {
  pid: 4242,
  bootId: 'b',
  startTicks: 1,
  exe: null,
  pidfsId: null,
  argv: ['/bin/sleep', '300'],
  uid: 0,
  ppid: 1,
  session: 4242,
  state: 'S',
  pidNs: null,
  processPidNs: null,
};
const base = {
  version: 2,
  id: 'vm',
  token: '0'.repeat(32),
  command: '/bin/sleep',
  args: ['300'],
  expect: [],
  paths: [],
  executable: null,
  pidSource: 'child' as const,
  pidFile: null,
  createdAt: 't',
  updatedAt: 't',
  supervisorPid: 1,
};
const running: Manifest = { ...base, state: 'running', identity, quarantine: null };
const starting: Manifest = { ...base, state: 'starting', identity: null, quarantine: null };
const confirmed: Manifest = { ...base, version: 3, state: 'starting', identity, quarantine: null };
const stopping: Manifest = { ...base, version: 3, state: 'stopping', identity, quarantine: null, stoppingSince: 't' };
const held: Manifest = {
  ...base,
  state: 'quarantined',
  identity,
  quarantine: { reason: 'reused', field: 'x', at: 't' },
};

describe('decideUnreadable / decideFailure', () => {
  const cases: Array<[string, unknown, unknown]> = [
    [
      'an interrupted first write is cleaned',
      new IncompleteInstanceError('/s/vm'),
      { do: 'clean', reason: 'incomplete' },
    ],
    [
      'a bad document is quarantined in memory, its message the field',
      new BadManifestError('/s/vm', 'token is not 32 hex digits'),
      { do: 'quarantine', reason: 'bad-manifest', field: expect.stringContaining('token'), persist: false },
    ],
    [
      'EMFILE opening it says nothing of the manifest: deferred',
      new BadManifestError('/s/vm', 'unreadable (EMFILE)', { cause: errno('EMFILE') }),
      { do: 'defer', error: expect.objectContaining({ code: 'EMFILE' }) },
    ],
    ['anything else is not recovery to judge', new TypeError('bug'), { do: 'rethrow' }],
  ];
  it.each(cases)('%s', (_, err, decision) => {
    expect(decideUnreadable(err)).toMatchObject(decision as object);
  });

  it.each([
    ['EMFILE', { do: 'defer' }],
    ['ENOMEM', { do: 'defer' }],
    ['EPERM', { do: 'rethrow' }],
  ])('a failure with %s while acting', (code, decision) => {
    expect(decideFailure(errno(code))).toMatchObject(decision);
  });
});

describe('decideManifest', () => {
  const provable = { provable: true, allowUnprovable: false };
  const cases: Array<[string, Manifest, { provable: boolean; allowUnprovable: boolean }, unknown]> = [
    ['a quarantine on disk stays, as recorded', held, provable, { do: 'quarantine', reason: 'reused', field: 'x' }],
    ['a running manifest is proven', running, provable, { do: 'prove' }],
    ['an interrupted launch is looked for', starting, provable, { do: 'prove' }],
    [
      'no proof on this platform: quarantined',
      running,
      { provable: false, allowUnprovable: false },
      { do: 'quarantine', reason: 'unprovable', persist: true },
    ],
    [
      'no proof, allowUnprovable: a running one adopted',
      running,
      { provable: false, allowUnprovable: true },
      { do: 'adopt', why: 'unprovable' },
    ],
    ['a starting one with its confirmed identity is proven', confirmed, provable, { do: 'prove' }],
    ['a stop cut off is proven', stopping, provable, { do: 'prove' }],
    [
      'no proof, allowUnprovable: a starting one with its confirmed identity is adopted as a running one',
      confirmed,
      { provable: false, allowUnprovable: true },
      { do: 'adopt', why: 'unprovable' },
    ],
    [
      'no proof, allowUnprovable: a stop cut off cannot be finished: quarantined',
      stopping,
      { provable: false, allowUnprovable: true },
      { do: 'quarantine', reason: 'unprovable', persist: true },
    ],
    [
      'no proof, allowUnprovable: an interrupted launch is still quarantined',
      starting,
      { provable: false, allowUnprovable: true },
      { do: 'quarantine', reason: 'unprovable' },
    ],
  ];
  it.each(cases)('%s', (_, m, platform, decision) => {
    expect(decideManifest(m, platform)).toMatchObject(decision as object);
  });
});

describe('decideRunning', () => {
  const facts = (more: Partial<RunningFacts>): RunningFacts => ({
    pid: 4242,
    selfPid: 99,
    current: true,
    paths: ['/run/vm.sock'],
    ...more,
  });
  const ok = { verdict: 'ok' } as const;
  const ours = { ours: true, by: 'token' } as const;
  const noToken = { ours: false, why: 'token' } as const;
  const argvMismatch = { verdict: 'mismatch', field: 'argv' } as const;
  const cases: Array<[string, Partial<RunningFacts>, unknown]> = [
    ['our own pid is never it', { pid: 99 }, { do: 'quarantine', reason: 'unprovable', field: 'pid' }],
    ['nothing read yet: the process first', {}, { do: 'read', what: 'process' }],
    ['gone: cleaned', { verdict: { verdict: 'gone' } }, { do: 'clean', reason: 'gone' }],
    ['rebooted: cleaned', { verdict: { verdict: 'rebooted', field: 'bootId' } }, { do: 'clean', reason: 'rebooted' }],
    [
      'another pid namespace: quarantined in memory only',
      { verdict: { verdict: 'unprovable', field: 'pidNs' } },
      { do: 'quarantine', reason: 'unprovable', field: 'pidNs', persist: false },
    ],
    [
      'reused: quarantined on disk',
      { verdict: { verdict: 'reused', field: 'startTicks' } },
      { do: 'quarantine', reason: 'reused', field: 'startTicks', persist: true },
    ],
    [
      'unrecorded: quarantined',
      { verdict: { verdict: 'unrecorded', field: 'bootId' } },
      { do: 'quarantine', reason: 'unrecorded' },
    ],
    ['verified: its cgroup next', { verdict: ok }, { do: 'read', what: 'cgroup' }],
    [
      'its cgroup is gone: a mismatch',
      { verdict: ok, cgroup: 'gone' },
      { do: 'quarantine', reason: 'mismatch', field: 'cgroup' },
    ],
    ['then the ownership rule', { verdict: ok, cgroup: 'same' }, { do: 'read', what: 'ownership' }],
    [
      'no token: a mismatch',
      { verdict: ok, cgroup: 'none', judgement: { ours: false, why: 'token' } },
      { do: 'quarantine', reason: 'mismatch', field: 'token' },
    ],
    [
      'an environment that may not be read: unprovable, never "no token"',
      { verdict: ok, cgroup: 'none', judgement: { ours: false, why: 'environ' } },
      { do: 'quarantine', reason: 'unprovable', field: 'environ' },
    ],
    [
      'pid 1, us or an ancestor: unprovable, field pid',
      { verdict: ok, cgroup: 'none', judgement: { ours: false, why: 'ancestor' } },
      { do: 'quarantine', reason: 'unprovable', field: 'pid' },
    ],
    [
      'a mismatch the rule rejects names the verify field',
      { verdict: { verdict: 'mismatch', field: 'argv' }, cgroup: 'none', judgement: { ours: false, why: 'token' } },
      { do: 'quarantine', reason: 'mismatch', field: 'argv' },
    ],
    [
      'outside its cgroup, proven by its pidfs id: adopted, and said to have left',
      { verdict: ok, pidfsId: true, cgroup: 'same', judgement: { ours: false, why: 'cgroup' } },
      { do: 'adopt', why: 'verified', rewrite: false, leftCgroup: true },
    ],
    [
      'outside its cgroup, a starting manifest proven by its pidfs id: adopted and rewritten as running',
      { starting: true, verdict: ok, pidfsId: true, cgroup: 'same', judgement: { ours: false, why: 'cgroup' } },
      { do: 'adopt', why: 'starting', rewrite: true, leftCgroup: true },
    ],
    [
      'outside its cgroup without a pidfs id: a mismatch of the cgroup',
      { verdict: ok, pidfsId: false, cgroup: 'same', judgement: { ours: false, why: 'cgroup' } },
      { do: 'quarantine', reason: 'mismatch', field: 'cgroup' },
    ],
    [
      'outside its cgroup with a pidfs id but another argv: no proof of the instance',
      {
        verdict: { verdict: 'mismatch', field: 'argv' },
        pidfsId: true,
        cgroup: 'same',
        judgement: { ours: false, why: 'cgroup' },
      },
      { do: 'quarantine', reason: 'mismatch', field: 'argv' },
    ],
    [
      'proven: adopted',
      { verdict: ok, cgroup: 'same', judgement: ours },
      { do: 'adopt', why: 'verified', rewrite: false },
    ],
    [
      'proven in an older format: adopted and rewritten',
      { current: false, verdict: ok, cgroup: 'none', judgement: ours },
      { do: 'adopt', rewrite: true },
    ],
    [
      'a starting manifest with its confirmed identity, proven: adopted and rewritten as running',
      { starting: true, verdict: ok, cgroup: 'none', judgement: ours },
      { do: 'adopt', why: 'starting', rewrite: true },
    ],
    [
      'an argv mismatch re-proved by the declared paths: repaired',
      {
        verdict: { verdict: 'mismatch', field: 'argv' },
        cgroup: 'none',
        judgement: ours,
        liveArgv: ['qemu', '-qmp', 'unix:/run/vm.sock'],
      },
      { do: 'repair', field: 'argv', reason: 'mismatch' },
    ],
    [
      'an argv mismatch without the declared paths: quarantined',
      { verdict: { verdict: 'mismatch', field: 'argv' }, cgroup: 'none', judgement: ours, liveArgv: ['qemu'] },
      { do: 'quarantine', reason: 'mismatch', field: 'argv' },
    ],
    [
      'a new title without the token or the paths, the pidfs id the same: renamed',
      { verdict: argvMismatch, pidfsId: true, cgroup: 'none', judgement: noToken, liveArgv: ['redis *:0'] },
      { do: 'repair', field: 'argv', reason: 'renamed' },
    ],
    [
      'a new title without the token, in its instance cgroup: renamed',
      { verdict: argvMismatch, cgroup: 'same', judgement: noToken, liveArgv: ['redis *:0'] },
      { do: 'repair', field: 'argv', reason: 'renamed' },
    ],
    [
      'a new title, the pidfs id the same, carrying the token: renamed, the paths not needed',
      { verdict: argvMismatch, pidfsId: true, cgroup: 'none', judgement: ours, liveArgv: ['qemu'] },
      { do: 'repair', field: 'argv', reason: 'renamed' },
    ],
    [
      'a title recorded once renamed, without the token, the pidfs id the same: adopted',
      { verdict: ok, pidfsId: true, recordedTitle: true, cgroup: 'none', judgement: noToken },
      { do: 'adopt', why: 'verified' },
    ],
    [
      'a record whose own argv carries the token, the live one the same, yet no token to judge by: a mismatch',
      { verdict: ok, pidfsId: true, recordedTitle: false, cgroup: 'none', judgement: noToken },
      { do: 'quarantine', reason: 'mismatch', field: 'token' },
    ],
    [
      'an env-mode token missing from the environment is no title: a mismatch, whatever the pidfs id',
      { verdict: argvMismatch, pidfsId: true, tokenMode: 'env', cgroup: 'none', judgement: noToken },
      { do: 'quarantine', reason: 'mismatch', field: 'argv' },
    ],
    [
      'the same pidfs id under another executable without the token: no rename, a mismatch',
      { verdict: { verdict: 'mismatch', field: 'exe' }, pidfsId: true, cgroup: 'none', judgement: noToken },
      { do: 'quarantine', reason: 'mismatch', field: 'exe' },
    ],
    [
      'the same pidfs id, another uid than recorded: not a title, still unprovable',
      { verdict: argvMismatch, pidfsId: true, cgroup: 'none', judgement: { ours: false, why: 'uid' } },
      { do: 'quarantine', reason: 'unprovable', field: 'uid' },
    ],
    [
      'start ticks alone and a title without the token: the older rule, a mismatch',
      { verdict: argvMismatch, pidfsId: false, cgroup: 'none', judgement: noToken },
      { do: 'quarantine', reason: 'mismatch', field: 'argv' },
    ],
    // A main process handed off by MAINPID=: a member of the instance, which carries no token of its own.
    [
      'handed off, no token, the pidfs id the same: adopted',
      { handedOff: true, verdict: ok, pidfsId: true, cgroup: 'none', judgement: noToken },
      { do: 'adopt', why: 'verified' },
    ],
    [
      'handed off, no token, in its instance cgroup without a pidfs id: adopted',
      { handedOff: true, verdict: ok, pidfsId: false, cgroup: 'same', judgement: noToken },
      { do: 'adopt', why: 'verified' },
    ],
    [
      'handed off, an env-mode token scrubbed from its environment, the pidfs id the same: adopted',
      { handedOff: true, tokenMode: 'env', verdict: ok, pidfsId: true, cgroup: 'none', judgement: noToken },
      { do: 'adopt', why: 'verified' },
    ],
    [
      'handed off, no token, neither pidfs id nor cgroup (js backend): quarantined, never signalled',
      { handedOff: true, verdict: ok, pidfsId: false, cgroup: 'none', judgement: noToken },
      { do: 'quarantine', reason: 'mismatch', field: 'token', persist: true },
    ],
    [
      "handed off, exec'd since it was named, the pidfs id the same: renamed",
      {
        handedOff: true,
        verdict: { verdict: 'mismatch', field: 'exe' },
        pidfsId: true,
        cgroup: 'none',
        judgement: noToken,
        foreignUid: false,
      },
      { do: 'repair', field: 'exe', reason: 'renamed' },
    ],
    [
      'handed off, a new title, the pidfs id the same, in its cgroup: renamed',
      { handedOff: true, verdict: argvMismatch, pidfsId: true, cgroup: 'same', judgement: noToken },
      { do: 'repair', field: 'argv', reason: 'renamed' },
    ],
    [
      "handed off, exec'd since, in its cgroup but without a pidfs id: start ticks are no proof of an exec, a mismatch",
      {
        handedOff: true,
        verdict: { verdict: 'mismatch', field: 'exe' },
        pidfsId: false,
        cgroup: 'same',
        judgement: noToken,
      },
      { do: 'quarantine', reason: 'mismatch', field: 'exe' },
    ],
    [
      "handed off, exec'd since, the pidfs id the same, another uid's: never taken on the record's word",
      {
        handedOff: true,
        verdict: { verdict: 'mismatch', field: 'exe' },
        pidfsId: true,
        cgroup: 'none',
        judgement: noToken,
        foreignUid: true,
      },
      { do: 'quarantine', reason: 'mismatch', field: 'exe' },
    ],
    [
      'handed off, the pidfs id the same, another uid than recorded: unprovable, as any',
      { handedOff: true, verdict: ok, pidfsId: true, cgroup: 'none', judgement: { ours: false, why: 'uid' } },
      { do: 'quarantine', reason: 'unprovable', field: 'uid' },
    ],
    [
      'handed off, outside its cgroup with another executable: no proof of the instance',
      {
        handedOff: true,
        verdict: { verdict: 'mismatch', field: 'exe' },
        pidfsId: true,
        cgroup: 'same',
        judgement: { ours: false, why: 'cgroup' },
      },
      { do: 'quarantine', reason: 'mismatch', field: 'exe' },
    ],
  ];
  it.each(cases)('%s', (_, more, decision) => {
    expect(decideRunning(facts(more))).toMatchObject(decision as object);
  });
});

describe('decideStarting', () => {
  // No fork of the dead supervisor short of its exec, unless a case says so.
  const facts = (more: Partial<StartingFacts>): StartingFacts => ({
    pidSource: 'child',
    executable: false,
    cgroup: 'none',
    unreadable: 0,
    preExec: 0,
    ...more,
  });
  const cases: Array<[string, Partial<StartingFacts>, unknown]> = [
    ['its cgroup is gone: its target is looked for outside it (moved out)', { cgroup: 'gone' }, { do: 'look' }],
    [
      '... found by its own marks: recorded (quarantined), never signalled',
      { cgroup: 'gone', found: true },
      { do: 'quarantine', reason: 'mismatch', field: 'cgroup', persist: true },
    ],
    [
      '... none: nothing of it is left, cleaned without a wait or a signal',
      { cgroup: 'gone', found: false, waitable: 1, timedOut: false },
      { do: 'clean', reason: 'gone', graceMs: 0 },
    ],
    [
      '... a carrier whose environment may not be read: unprovable, never gone',
      { cgroup: 'gone', found: false, unreadable: 1 },
      { do: 'quarantine', reason: 'unprovable', field: 'environ' },
    ],
    [
      '... a refused pidfile names nothing: kept, never signalled',
      { cgroup: 'gone', pidSource: 'file', pidfileRefused: true },
      { do: 'quarantine', reason: 'unprovable', field: 'pidfile' },
    ],
    [
      '... no fork of the dead supervisor is waited for: one could not have joined a removed cgroup',
      { cgroup: 'gone', preExec: undefined },
      { do: 'look' },
    ],
    ['first the forks short of their exec are looked at', { preExec: undefined }, { do: 'look-forks' }],
    [
      '... before anything else is decided, even for a pid function naming no program',
      { preExec: undefined, pidSource: 'function', carriers: 0 },
      { do: 'look-forks' },
    ],
    ['one is still before its exec: waited for', { preExec: 1, timedOut: false }, { do: 'wait' }],
    [
      '... whatever a look found meanwhile',
      { preExec: 1, found: false, waitable: 0, ended: true, timedOut: false },
      { do: 'wait' },
    ],
    [
      '... past the confirm bound: deferred, never cleaned nor quarantined',
      { preExec: 2, timedOut: true },
      { do: 'defer', error: { code: 'EAGAIN' } },
    ],
    [
      "one exec'd late in the bound, no target yet: deferred, its launcher never ended on a bound it did not have",
      { forkExecd: true, found: false, waitable: 1, timedOut: true },
      { do: 'defer', error: { code: 'EAGAIN' } },
    ],
    [
      '... within the bound: waited for as any candidate',
      { forkExecd: true, found: false, waitable: 1, timedOut: false },
      { do: 'wait' },
    ],
    [
      'in its cgroup a fork is a member: looked for as members are',
      { cgroup: 'same', preExec: undefined },
      { do: 'look' },
    ],
    [
      "a pid function's cgroup gone: still looked for elsewhere",
      { pidSource: 'function', executable: true, cgroup: 'gone' },
      { do: 'look' },
    ],
    ['a pid function naming no program: carriers counted', { pidSource: 'function' }, { do: 'count-carriers' }],
    ['... none: cleaned', { pidSource: 'function', carriers: 0 }, { do: 'clean', reason: 'gone' }],
    [
      '... some: none can be proven the target',
      { pidSource: 'function', carriers: 2 },
      { do: 'quarantine', reason: 'unprovable', field: 'executable' },
    ],
    [
      'a refused pidfile: kept, never signalled, whatever else is found',
      { pidSource: 'file', pidfileRefused: true, found: false, waitable: 1 },
      { do: 'quarantine', reason: 'unprovable', field: 'pidfile', persist: true },
    ],
    ['first a look for the target', {}, { do: 'look' }],
    ['found: adopted as running', { found: true }, { do: 'adopt', why: 'starting' }],
    ['not yet, candidates left: wait', { found: false, waitable: 1, timedOut: false }, { do: 'wait' }],
    [
      'the confirm bound passed: its carriers ended',
      { found: false, waitable: 1, timedOut: true },
      { do: 'end-carriers' },
    ],
    ['no candidates left: its carriers ended', { found: false, waitable: 0 }, { do: 'end-carriers' }],
    [
      'in its cgroup: the clean ends the members, nothing else is',
      { cgroup: 'same', found: false, waitable: 0 },
      { do: 'clean', reason: 'gone', graceMs: 2000 },
    ],
    ['ended: cleaned', { found: false, waitable: 0, ended: true }, { do: 'clean', reason: 'gone' }],
    [
      'an environment that may not be read: unprovable, never "gone"',
      { found: false, waitable: 0, ended: true, unreadable: 1 },
      { do: 'quarantine', reason: 'unprovable', field: 'environ' },
    ],
  ];
  it.each(cases)('%s', (_, more, decision) => {
    expect(decideStarting(facts(more))).toMatchObject(decision as object);
  });
});

describe('decideStopping', () => {
  const facts = (more: Partial<StoppingFacts>): StoppingFacts => ({
    pid: 4242,
    selfPid: 99,
    current: true,
    paths: [],
    ...more,
  });
  const ok = { verdict: 'ok' } as const;
  const ours = { ours: true, by: 'token' } as const;
  const cases: Array<[string, Partial<StoppingFacts>, unknown]> = [
    ['our own pid is never it', { pid: 99 }, { do: 'quarantine', reason: 'unprovable', field: 'pid' }],
    ['its cgroup first: it names the members', {}, { do: 'read', what: 'cgroup' }],
    [
      'its cgroup is there: the main process next (it may have left)',
      { cgroup: 'same' },
      { do: 'read', what: 'process' },
    ],
    [
      'its cgroup is there, the main gone: what is in the cgroup is ended with it',
      { cgroup: 'same', verdict: { verdict: 'gone' } },
      { do: 'clean', reason: 'stopped', graceMs: 2000 },
    ],
    [
      'its cgroup is there, the main without a pidfs id: the cgroup alone, the main never judged',
      { cgroup: 'same', verdict: ok, pidfsId: false },
      { do: 'clean', reason: 'stopped', graceMs: 2000 },
    ],
    [
      'its cgroup is there, the main proven by its pidfs id: the ownership rule next',
      { cgroup: 'same', verdict: ok, pidfsId: true },
      { do: 'read', what: 'ownership' },
    ],
    [
      'the main proven by its pidfs id, outside its cgroup: ended through its pin first',
      { cgroup: 'same', verdict: ok, pidfsId: true, judgement: { ours: false, why: 'cgroup' } },
      { do: 'end-main' },
    ],
    [
      'the main proven by its pidfs id, in its cgroup: ended with the cgroup',
      { cgroup: 'same', verdict: ok, pidfsId: true, judgement: { ours: true, by: 'cgroup' } },
      { do: 'clean', reason: 'stopped', graceMs: 2000 },
    ],
    [
      'the main that left its cgroup, ended: the cgroup next',
      { cgroup: 'same', verdict: ok, pidfsId: true, judgement: { ours: false, why: 'cgroup' }, ended: true },
      { do: 'clean', reason: 'stopped', graceMs: 2000 },
    ],
    ['its cgroup is gone: nothing of it runs', { cgroup: 'gone' }, { do: 'clean', reason: 'stopped', graceMs: 0 }],
    ['no cgroup: the main process next', { cgroup: 'none' }, { do: 'read', what: 'process' }],
    [
      'the main process is gone (the stop killed it): what it left is ended',
      { cgroup: 'none', verdict: { verdict: 'gone' } },
      { do: 'end-members', main: false },
    ],
    [
      'rebooted: nothing of it runs',
      { cgroup: 'none', verdict: { verdict: 'rebooted', field: 'bootId' } },
      { do: 'clean', reason: 'rebooted' },
    ],
    [
      'reused: quarantined, nothing signalled',
      { cgroup: 'none', verdict: { verdict: 'reused', field: 'startTicks' } },
      { do: 'quarantine', reason: 'reused', field: 'startTicks', persist: true },
    ],
    ['verified: the ownership rule next', { cgroup: 'none', verdict: ok }, { do: 'read', what: 'ownership' }],
    [
      'verified and ours: ended with its members',
      { cgroup: 'none', verdict: ok, judgement: ours },
      { do: 'end-members', main: true },
    ],
    [
      'verified but not ours: quarantined',
      { cgroup: 'none', verdict: ok, judgement: { ours: false, why: 'token' } },
      { do: 'quarantine', reason: 'mismatch', field: 'token' },
    ],
    [
      'ended: cleaned as stopped',
      { cgroup: 'none', verdict: { verdict: 'gone' }, ended: true, unreadable: 0 },
      { do: 'clean', reason: 'stopped', graceMs: 0 },
    ],
    [
      'ended, but a carrier whose environment may not be read: unprovable',
      { cgroup: 'none', verdict: { verdict: 'gone' }, ended: true, unreadable: 1 },
      { do: 'quarantine', reason: 'unprovable', field: 'environ' },
    ],
  ];
  it.each(cases)('%s', (_, more, decision) => {
    expect(decideStopping(facts(more))).toMatchObject(decision as object);
  });
});
