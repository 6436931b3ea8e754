// The slotune LLMDeployment health check, run as Argo CD runs a resource customization's
// health.lua: in gopher-lua, with the package, base and table libraries only, a one-second
// deadline, the object as the global `obj` (decoded as Argo CD decodes an unstructured object),
// and the returned table's status and message compared with health_test.yaml, case by case.
//
//	cd tools/argocd && go test ./...
package argocd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

const dir = "resource_customizations/slotune.dev/LLMDeployment"

// Argo CD's health status codes; anything else it shows as Unknown.
var codes = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true,
	"Missing": true, "Unknown": true,
}

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type testCase struct {
	HealthStatus healthStatus `json:"healthStatus"`
	InputPath    string       `json:"inputPath"`
}

// decode turns a decoded JSON value into Lua values as Argo CD's VM does: numbers become
// LNumber, maps tables keyed by string, lists arrays from index 1, null nil.
func decode(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case []any:
		t := l.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(decode(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), decode(l, item))
		}
		return t
	}
	return lua.LNil
}

func health(t *testing.T, script string, obj map[string]any) healthStatus {
	t.Helper()
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		l.Push(l.NewFunction(lib.open))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decode(l, obj))
	if err := l.DoString(script); err != nil {
		t.Fatalf("health.lua failed: %v", err)
	}
	returned, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("health.lua returned %s, not a table", l.Get(-1).Type())
	}
	return healthStatus{
		Status:  lua.LVAsString(returned.RawGetString("status")),
		Message: lua.LVAsString(returned.RawGetString("message")),
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestHealth(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Tests []testCase `json:"tests"`
	}
	readYAML(t, filepath.Join(dir, "health_test.yaml"), &spec)
	if len(spec.Tests) == 0 {
		t.Fatal("health_test.yaml lists no tests")
	}
	for _, c := range spec.Tests {
		t.Run(c.InputPath, func(t *testing.T) {
			var obj map[string]any
			readYAML(t, filepath.Join(dir, c.InputPath), &obj)
			got := health(t, string(script), obj)
			if !codes[got.Status] {
				t.Fatalf("status %q is not one of Argo CD's health codes", got.Status)
			}
			if got != c.HealthStatus {
				t.Errorf("got %+v, want %+v", got, c.HealthStatus)
			}
		})
	}
}
