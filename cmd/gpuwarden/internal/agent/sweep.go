package agent

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// startSweeping removes, every sweep interval, the control directories that
// nothing claims any more (deviceplugin.Sweeper), and the settings saved for
// containers whose directories are gone.
func (a *Agent) startSweeping(resolver *cgroups.Resolver) {
	s := &deviceplugin.Sweeper{ControlDir: a.cfg.ControlDir, ProcRoot: a.cfg.Paths.Proc,
		Collector: allocation.Collector{Grace: a.cfg.ControlDirGrace}}
	if a.plugin != nil {
		s.Lock = a.plugin.DirLock()
	}
	if a.driver != nil { // never beside the device plugin (config.Validate)
		s.Lock, s.Prepared = a.driver.DirLock(), a.driver.Prepared
	}
	if a.pods != nil {
		s.Listed = deviceplugin.ListedDirs(a.pods)
	}
	if a.relay != nil {
		s.Release = a.relay.Release
	}
	if resolver != nil {
		s.CgroupKeys = func() (map[string]bool, error) {
			keys := map[string]bool{}
			for _, p := range resolver.Paths() {
				keys[controlblock.ContainerKey(p)] = true
			}
			return keys, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.closers = append(a.closers, func() error { cancel(); return nil })
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		t := time.NewTicker(s.Collector.Interval())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			removed, err := s.Sweep(ctx, time.Now())
			if err != nil {
				a.log.Warn("control directories not all swept", "err", err)
			}
			if len(removed) > 0 {
				a.log.Info("removed the control directories of containers that are gone", "dirs", removed)
			}
			if a.settings != nil {
				err := a.settings.Prune(func(dir string) bool {
					_, err := os.Lstat(filepath.Join(a.cfg.ControlDir, dir))
					return err == nil
				})
				if err != nil {
					a.log.Warn("saved settings not pruned", "err", err)
				}
			}
		}
	}()
}
