/**
 * An instance cgroup is a tree. A member may mkdir a cgroup inside its
 * instance's and move there (anyone who may write the instance cgroup may):
 * it is still the instance's. This module is that rule for the rest of
 * custody: membership is "in the cgroup or below it" (inSubtree), the walk
 * over the subtree is bounded in depth and count and never follows a
 * symlink, and removal goes children first, once `populated 0` (which covers
 * descendants) has proven the whole subtree empty. What cannot be removed is
 * reported, never thrown: the processes are proven gone by then.
 */
import { type Dirent, readdirSync, rmdirSync } from 'node:fs';
import * as path from 'node:path';
import type { Emit } from '../events.js';

/** How deep, and how many, cgroups below an instance cgroup are walked: a member cannot make the walk unbounded. */
const SUBTREE_DEPTH = 32;
const SUBTREE_MAX = 1024;

const code = (err: unknown) => (err as NodeJS.ErrnoException)?.code;

/** A cgroup directory a removal left behind, and why (an errno code, or the reason it was not tried). */
export interface CgroupLeftover {
  path: string;
  why: string;
}

/**
 * Whether a process in hierarchy cgroup `where` (as /proc/<pid>/cgroup names it) is inside cgroup `node`:
 * in it, or in a cgroup below it. A sibling whose name merely starts the same is not.
 */
export function inSubtree(where: string | null, node: string): boolean {
  return where !== null && (where === node || where.startsWith(node.endsWith('/') ? node : `${node}/`));
}

/**
 * A cgroup directory and every cgroup below it, each after its parent (removal walks it backwards: children
 * first). Only real directories are descended into (a symlink is never followed; cgroupfs makes none), at
 * most SUBTREE_DEPTH deep and SUBTREE_MAX cgroups: `truncated` says the bound was hit.
 */
export function subtree(root: string): { dirs: string[]; truncated: boolean } {
  const dirs: string[] = [];
  let truncated = false;
  const stack: Array<{ dir: string; depth: number }> = [{ dir: root, depth: 0 }];
  for (let next = stack.pop(); next; next = stack.pop()) {
    const { dir, depth } = next;
    dirs.push(dir);
    let entries: Dirent[];
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch (err) {
      if (code(err) === 'ENOENT' || code(err) === 'ENODEV') continue;
      throw err;
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      if (depth + 1 > SUBTREE_DEPTH || dirs.length + stack.length >= SUBTREE_MAX) truncated = true;
      else stack.push({ dir: path.join(dir, e.name), depth: depth + 1 });
    }
  }
  return { dirs, truncated };
}

/** One pass of rmdir over the subtree, children first: what is left, and why. Gone already is removed. */
export function removeSubtree(root: string): CgroupLeftover[] {
  const left: CgroupLeftover[] = [];
  let tree: { dirs: string[]; truncated: boolean };
  try {
    tree = subtree(root);
  } catch (err) {
    return [{ path: root, why: code(err) ?? String(err) }];
  }
  for (const dir of tree.dirs.reverse()) {
    try {
      rmdirSync(dir);
    } catch (err) {
      if (code(err) !== 'ENOENT') left.push({ path: dir, why: code(err) ?? String(err) });
    }
  }
  // First: it explains the EBUSY of every ancestor of what the walk did not reach.
  if (tree.truncated)
    left.unshift({ path: root, why: `more than ${SUBTREE_MAX} cgroups or ${SUBTREE_DEPTH} levels below it` });
  return left;
}

/**
 * Removes an instance's cgroup (InstanceCgroup.remove) once its processes are proven gone; what is left
 * behind is a warning naming it, never a failure. Recovery's pass over cgroups no manifest names retries it.
 */
export async function removeCgroup(
  cg: { path: string; remove(ms?: number): Promise<CgroupLeftover[]> },
  emit: Emit,
  id?: string,
  ms?: number,
): Promise<void> {
  const left = await cg.remove(ms);
  if (left.length === 0) return;
  // A chain past the walk's bound leaves every ancestor too: the first names it.
  const first = left[0];
  const more = left.length > 1 ? ` and ${left.length - 1} more` : '';
  emit('warning', {
    ...(id === undefined ? {} : { id }),
    cgroup: cg.path,
    message: `${id === undefined ? '' : `${id}: `}cgroup(s) not removed: ${first?.path} (${first?.why})${more}; left for recovery to remove`,
  });
}
