// Command walk measures how many source files one request "walks" through
// in the root package of a Go repository. See README.txt for the method.
package main

import (
	"flag"
	"fmt"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/cha"
	"golang.org/x/tools/go/callgraph/vta"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

func main() {
	dir := flag.String("dir", ".", "repository directory whose root package is measured")
	start := flag.String("start", "ProxyFunc", "start function: ProxyFunc = (*Switch).ProxyFunc, RoundTrip = (*transport).RoundTrip, or Recv.Method / Func")
	algo := flag.String("cg", "vta", "call graph for dynamic calls: vta or cha")
	verbose := flag.Bool("v", false, "print each function at first entry (indented by call depth)")
	maxDepth := flag.Int("depth", -1, "exploration aid: do not enter functions deeper than this many root-function calls below the start (-1 = unlimited, the method)")
	table := flag.Bool("table", false, "exploration aid: also print the three figures for every depth limit")
	flag.Parse()

	recv, method := "", *start
	switch *start {
	case "ProxyFunc":
		recv, method = "Switch", "ProxyFunc"
	case "RoundTrip":
		recv, method = "transport", "RoundTrip"
	default:
		if i := strings.LastIndex(*start, "."); i >= 0 {
			recv, method = strings.Trim((*start)[:i], "(*)"), (*start)[i+1:]
		}
	}

	abs, err := filepath.Abs(*dir)
	check(err)
	cfg := &packages.Config{
		Mode:  packages.LoadSyntax, // syntax + types for the root package; deps from export data
		Dir:   abs,
		Tests: false,
	}
	pkgs, err := packages.Load(cfg, ".")
	check(err)
	if packages.PrintErrors(pkgs) > 0 || len(pkgs) != 1 {
		fmt.Fprintln(os.Stderr, "walk: could not load exactly one root package")
		os.Exit(1)
	}
	prog, ssaPkgs := ssautil.Packages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	root := ssaPkgs[0]
	rootTypes := root.Pkg

	// inRoot: the function is defined in the root package (directly, as an
	// anonymous function, as an instance of a root generic, or as a
	// synthetic wrapper/thunk/bound-method closure of a root method).
	var inRoot func(fn *ssa.Function) bool
	inRoot = func(fn *ssa.Function) bool {
		if fn == nil {
			return false
		}
		if fn.Pkg == root {
			return true
		}
		if o := fn.Origin(); o != nil && o != fn {
			return inRoot(o)
		}
		if fn.Parent() != nil {
			return inRoot(fn.Parent())
		}
		if obj, ok := fn.Object().(*types.Func); ok && obj.Pkg() == rootTypes {
			return true
		}
		return false
	}
	// counted: a real (non-synthetic) root function, i.e. one with source.
	counted := func(fn *ssa.Function) bool {
		if !inRoot(fn) {
			return false
		}
		if fn.Synthetic == "" {
			return true
		}
		o := fn.Origin()
		return o != nil && o != fn && o.Synthetic == ""
	}
	fileOf := func(fn *ssa.Function) string {
		if o := fn.Origin(); o != nil && o != fn {
			fn = o
		}
		pos := fn.Pos()
		if !pos.IsValid() && fn.Syntax() != nil {
			pos = fn.Syntax().Pos()
		}
		return filepath.Base(prog.Fset.Position(pos).Filename)
	}

	// Call graph for dynamic calls.
	all := ssautil.AllFunctions(prog)
	chaG := cha.CallGraph(prog)
	var g *callgraph.Graph
	switch *algo {
	case "cha":
		g = chaG
	case "vta":
		funcs := map[*ssa.Function]bool{}
		for fn := range all {
			if inRoot(fn) {
				funcs[fn] = true
			}
		}
		g = vta.CallGraph(funcs, chaG)
	default:
		check(fmt.Errorf("unknown -cg %q", *algo))
	}

	// Find the start function.
	var startFn *ssa.Function
	if recv == "" {
		startFn = root.Func(method)
	} else {
		T := root.Type(recv)
		if T == nil {
			check(fmt.Errorf("no type %s in root package", recv))
		}
		for _, t := range []types.Type{types.NewPointer(T.Type()), T.Type()} {
			if sel := prog.MethodSets.MethodSet(t).Lookup(rootTypes, method); sel != nil {
				startFn = prog.MethodValue(sel)
				break
			}
		}
	}
	if startFn == nil {
		check(fmt.Errorf("start function %q not found", *start))
	}

	// Callees of one call site, restricted to the root package, in a fixed order.
	sitesCallees := func(fn *ssa.Function) [][]*ssa.Function {
		var sites []ssa.CallInstruction
		for _, b := range fn.Blocks {
			for _, instr := range b.Instrs {
				if site, ok := instr.(ssa.CallInstruction); ok {
					sites = append(sites, site)
				}
			}
		}
		// Source order of the call instructions (stable: block order for ties/NoPos).
		sort.SliceStable(sites, func(i, j int) bool { return sites[i].Pos() < sites[j].Pos() })
		node := g.Nodes[fn]
		var out [][]*ssa.Function
		for _, site := range sites {
			var cs []*ssa.Function
			if callee := site.Common().StaticCallee(); callee != nil {
				cs = []*ssa.Function{callee}
			} else if node != nil {
				seen := map[*ssa.Function]bool{}
				for _, e := range node.Out {
					if e.Site == site && !seen[e.Callee.Func] {
						seen[e.Callee.Func] = true
						cs = append(cs, e.Callee.Func)
					}
				}
			}
			var keep []*ssa.Function
			for _, c := range cs {
				if inRoot(c) {
					keep = append(keep, c)
				}
			}
			// Several targets of one dynamic site: in order of their source position.
			sort.Slice(keep, func(i, j int) bool {
				pi, pj := prog.Fset.Position(keep[i].Pos()), prog.Fset.Position(keep[j].Pos())
				if pi.Filename != pj.Filename {
					return pi.Filename < pj.Filename
				}
				if pi.Offset != pj.Offset {
					return pi.Offset < pj.Offset
				}
				return keep[i].String() < keep[j].String()
			})
			if len(keep) > 0 {
				out = append(out, keep)
			}
		}
		return out
	}

	notes = func(fn *ssa.Function, unresolved, escaping *[]string) {
		node := g.Nodes[fn]
		for _, b := range fn.Blocks {
			for _, instr := range b.Instrs {
				site, ok := instr.(ssa.CallInstruction)
				if !ok {
					continue
				}
				where := fmt.Sprintf("%s (%s)", fn.RelString(rootTypes), filepath.Base(prog.Fset.Position(site.Pos()).String()))
				if _, ok := site.Common().Value.(*ssa.Builtin); ok {
					continue // len, append, min, ...
				}
				callee := site.Common().StaticCallee()
				if callee == nil {
					n := 0
					if node != nil {
						for _, e := range node.Out {
							if e.Site == site && inRoot(e.Callee.Func) {
								n++
							}
						}
					}
					if n == 0 {
						*unresolved = append(*unresolved, where+": "+site.Common().Description()+" "+site.Common().Value.Type().String())
					}
					continue
				}
				if inRoot(callee) {
					continue
				}
				for _, a := range site.Common().Args {
					var f *ssa.Function
					switch v := a.(type) {
					case *ssa.Function:
						f = v
					case *ssa.MakeClosure:
						f, _ = v.Fn.(*ssa.Function)
					}
					if f != nil && inRoot(f) {
						*escaping = append(*escaping, where+": "+f.RelString(rootTypes)+" -> "+callee.RelString(rootTypes))
					}
				}
			}
		}
	}

	// Notes on what the walk cannot follow (filled by the unlimited walk).
	var unresolved, escaping []string

	// Depth-first walk, pre-order; each function entered once.
	type result struct {
		fnCount, returns, deepest int
		walk                      []string
		entries                   map[string]int
	}
	run := func(limit int, print bool) result {
		visited := map[*ssa.Function]bool{}
		var seq []string // file of each counted function at first entry
		var r result
		var visit func(fn *ssa.Function, depth int)
		visit = func(fn *ssa.Function, depth int) {
			if visited[fn] {
				return
			}
			d := depth
			if counted(fn) {
				if limit >= 0 && depth > limit {
					return
				}
				r.fnCount++
				if depth > r.deepest {
					r.deepest = depth
				}
				seq = append(seq, fileOf(fn))
				if print {
					fmt.Printf("%s%s  [%s]\n", strings.Repeat("  ", depth), fn.RelString(rootTypes), fileOf(fn))
				}
				d++
			}
			visited[fn] = true
			for _, cs := range sitesCallees(fn) {
				for _, c := range cs {
					visit(c, d)
				}
			}
			if limit < 0 && print {
				notes(fn, &unresolved, &escaping)
			}
		}
		visit(startFn, 0)

		// Collapse consecutive repeats.
		for _, f := range seq {
			if len(r.walk) == 0 || r.walk[len(r.walk)-1] != f {
				r.walk = append(r.walk, f)
			}
		}
		r.entries = map[string]int{}
		for _, f := range r.walk {
			if r.entries[f] > 0 {
				r.returns++
			}
			r.entries[f]++
		}
		return r
	}
	res := run(*maxDepth, *verbose)
	fnCount, walk, entries, returns := res.fnCount, res.walk, res.entries, res.returns
	files := make([]string, 0, len(entries))
	for f := range entries {
		files = append(files, f)
	}
	sort.Slice(files, func(i, j int) bool {
		if entries[files[i]] != entries[files[j]] {
			return entries[files[i]] > entries[files[j]]
		}
		return files[i] < files[j]
	})

	fmt.Printf("dir:        %s\n", abs)
	fmt.Printf("start:      %s  (call graph for dynamic calls: %s)\n", startFn.RelString(rootTypes), *algo)
	fmt.Printf("functions entered (root package, non-synthetic): %d\n", fnCount)
	fmt.Printf("distinct files touched:             %d\n", len(entries))
	fmt.Printf("returns to a file already left:     %d\n", returns)
	fmt.Printf("collapsed walk length (entries):    %d\n", len(walk))
	fmt.Println("entries per file:")
	for _, f := range files {
		fmt.Printf("  %-20s %d\n", f, entries[f])
	}
	fmt.Println("sequence:")
	fmt.Printf("  %s\n", strings.Join(walk, " -> "))
	if *verbose && *maxDepth < 0 {
		fmt.Printf("dynamic call sites in entered functions with no root-package target: %d\n", len(unresolved))
		for _, u := range unresolved {
			fmt.Printf("  %s\n", u)
		}
		fmt.Printf("root-package function values passed to non-root callees (not entered): %d\n", len(escaping))
		for _, e := range escaping {
			fmt.Printf("  %s\n", e)
		}
	}
	if *table {
		fmt.Println("depth limit table (exploration aid): depth files returns functions  [lease.go entries]")
		full := run(-1, false)
		for l := 0; l <= full.deepest; l++ {
			r := run(l, false)
			fmt.Printf("  %3d %3d %3d %4d  [%d]\n", l, len(r.entries), r.returns, r.fnCount, r.entries["lease.go"])
		}
	}
}

// notes records, for one entered function, the dynamic call sites that
// resolve to no root-package function and the root-package function values
// handed to callees outside the root package (e.g. sync.Once.Do, sort.Slice,
// time.AfterFunc): the walk does not enter those.
var notes func(fn *ssa.Function, unresolved, escaping *[]string)

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "walk:", err)
		os.Exit(1)
	}
}
