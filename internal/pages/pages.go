package main

import (
	"bufio"
	"cmp"
	"debug/buildinfo"
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

const (
	pageSize = 4096
	window   = 64 << 10 // the kernel's default fault-around
	mib      = 1 << 20
)

// mapping is one mapping of the executable and its pages' residency.
type mapping struct {
	start, end uint64
	perm       string
	resident   []bool // per page
	// windows with a resident page, and with all their pages resident
	touched, full int
}

// table is one of .gopclntab's tables: its size and its resident bytes.
type table struct {
	name           string
	size, resident uint64
}

// report is what measure found.
type report struct {
	exe      string
	mappings []*mapping
	// resident bytes by section, and of .text by module
	sections map[string]uint64
	modules  map[string]float64
	// pclntab's tables
	pcln []table
	// resident pages in large folios of the page cache, -1 when unknown
	large int
}

// measure reads the residency of pid's executable.
func measure(pid int) (*report, error) {
	proc := fmt.Sprintf("/proc/%d", pid)
	exe, err := os.Readlink(proc + "/exe")
	if err != nil {
		return nil, err
	}
	r := &report{exe: exe, sections: map[string]uint64{}, modules: map[string]float64{}, large: -1}
	if r.mappings, err = mappings(proc+"/maps", exe); err != nil {
		return nil, err
	}
	if len(r.mappings) == 0 {
		return nil, fmt.Errorf("%s has no mapping of %s", proc, exe)
	}
	pfns, err := residency(proc+"/pagemap", r.mappings)
	if err != nil {
		return nil, err
	}
	r.large = largeFolios(pfns)
	f, err := elf.Open(proc + "/exe")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mods := modulesOf(proc + "/exe")
	funcs, err := functions(f)
	if err != nil {
		return nil, err
	}
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Addr == 0 || s.Type == elf.SHT_NOBITS && s.Name != ".bss" && s.Name != ".noptrbss" {
			continue
		}
		for p := s.Addr &^ (pageSize - 1); p < s.Addr+s.Size; p += pageSize {
			if !r.isResident(p) {
				continue
			}
			lo, hi := max(p, s.Addr), min(p+pageSize, s.Addr+s.Size)
			r.sections[s.Name] += hi - lo
			if s.Name == ".text" {
				r.share(funcs, mods, lo, hi)
			}
		}
		if s.Name == ".gopclntab" {
			r.pcln = r.pclnTables(s)
		}
	}
	return r, nil
}

// mappings returns the mappings of exe listed in maps.
func mappings(maps, exe string) ([]*mapping, error) {
	f, err := os.Open(maps)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: %q", maps, sc.Text())
		}
		out = append(out, &mapping{start: start, end: end, perm: fields[1]})
	}
	return out, sc.Err()
}

// residency fills each mapping's pages and windows from pagemap and
// returns the page frames of the resident pages (zero without root).
func residency(pagemap string, ms []*mapping) ([]uint64, error) {
	f, err := os.Open(pagemap)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pfns []uint64
	for _, m := range ms {
		n := (m.end - m.start) / pageSize
		buf := make([]byte, n*8)
		if _, err := f.ReadAt(buf, int64(m.start/pageSize*8)); err != nil && err != io.EOF {
			return nil, fmt.Errorf("%s: %w", pagemap, err)
		}
		m.resident = make([]bool, n)
		for i := range m.resident {
			e := binary.LittleEndian.Uint64(buf[i*8:])
			if m.resident[i] = e>>63 == 1; m.resident[i] {
				pfns = append(pfns, e&(1<<55-1))
			}
		}
		for w := m.start &^ (window - 1); w < m.end; w += window {
			some, all := false, true
			for p := max(w, m.start); p < min(w+window, m.end); p += pageSize {
				res := m.resident[(p-m.start)/pageSize]
				some, all = some || res, all && res
			}
			if some {
				m.touched++
				if all {
					m.full++
				}
			}
		}
	}
	return pfns, nil
}

// largeFolios counts the frames that belong to a large folio (a compound
// page: KPF_COMPOUND_HEAD or _TAIL), or returns -1 when kpageflags or the
// frames cannot be read.
func largeFolios(pfns []uint64) int {
	f, err := os.Open("/proc/kpageflags")
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	var b [8]byte
	for _, pfn := range pfns {
		if pfn == 0 {
			return -1
		}
		if _, err := f.ReadAt(b[:], int64(pfn*8)); err != nil {
			return -1
		}
		if flags := binary.LittleEndian.Uint64(b[:]); flags&(1<<15|1<<16) != 0 {
			n++
		}
	}
	return n
}

func (r *report) isResident(addr uint64) bool {
	for _, m := range r.mappings {
		if addr >= m.start && addr < m.end {
			return m.resident[(addr-m.start)/pageSize]
		}
	}
	return false
}

// functions returns the executable's functions, by address, from its
// function table (.gopclntab), which a stripped binary keeps.
func functions(f *elf.File) ([]gosym.Func, error) {
	pcln, text := f.Section(".gopclntab"), f.Section(".text")
	if pcln == nil || text == nil {
		return nil, errors.New("not a Go executable: no .gopclntab or .text")
	}
	data, err := pcln.Data()
	if err != nil {
		return nil, err
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		return nil, err
	}
	funcs := slices.Clone(tab.Funcs)
	slices.SortFunc(funcs, func(a, b gosym.Func) int { return cmp.Compare(a.Entry, b.Entry) })
	return funcs, nil
}

// share divides the resident bytes [lo, hi) of .text among the modules of
// the functions they hold.
func (r *report) share(funcs []gosym.Func, mods []string, lo, hi uint64) {
	i := sort.Search(len(funcs), func(i int) bool { return funcs[i].End > lo })
	for ; i < len(funcs) && funcs[i].Entry < hi; i++ {
		fn := funcs[i]
		if b, e := max(fn.Entry, lo), min(fn.End, hi); e > b {
			r.modules[moduleOf(fn.Name, mods)] += float64(e - b)
		}
	}
}

// modulesOf returns the module paths the executable was built from, the
// longest first.
func modulesOf(exe string) []string {
	bi, err := buildinfo.ReadFile(exe)
	if err != nil {
		return nil
	}
	mods := []string{bi.Main.Path}
	for _, d := range bi.Deps {
		mods = append(mods, d.Path)
	}
	slices.SortFunc(mods, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return mods
}

// moduleOf returns the module of a function symbol among mods (longest
// first): that of its package (the name up to the first dot after the last
// slash; a type's equality function counts for its type's package),
// "runtime" for the runtime's, "std" for the rest of the standard
// library's.
func moduleOf(sym string, mods []string) string {
	sym = strings.TrimPrefix(sym, "type:.eq.")
	if i := strings.IndexByte(sym, '['); i >= 0 {
		sym = sym[:i] // an instantiation's type arguments
	}
	pkg := sym
	// A dot in the package path's last element is escaped (%2e).
	if i := strings.IndexByte(sym[strings.LastIndexByte(sym, '/')+1:], '.'); i >= 0 {
		pkg = sym[:strings.LastIndexByte(sym, '/')+1+i]
	}
	pkg = strings.ReplaceAll(pkg, "%2e", ".")
	for _, m := range mods {
		if pkg == m || strings.HasPrefix(pkg, m+"/") {
			return m
		}
	}
	if pkg == "runtime" || strings.HasPrefix(pkg, "runtime/") || strings.HasPrefix(pkg, "internal/runtime/") {
		return "runtime"
	}
	return "std"
}

// pclnTables returns the tables of .gopclntab (Go 1.20's layout and
// later, 64-bit) with their resident bytes.
func (r *report) pclnTables(s *elf.Section) []table {
	hdr := make([]byte, 72)
	if _, err := s.ReadAt(hdr, 0); err != nil || binary.LittleEndian.Uint32(hdr) != 0xfffffff1 || hdr[7] != 8 {
		return nil
	}
	off := func(i int) uint64 { return binary.LittleEndian.Uint64(hdr[8+8*i:]) }
	bounds := []struct {
		name   string
		lo, hi uint64
	}{
		{"funcnametab", off(3), off(4)},
		{"cutab", off(4), off(5)},
		{"filetab", off(5), off(6)},
		{"pctab", off(6), off(7)},
		{"functab", off(7), s.Size},
	}
	var out []table
	for _, b := range bounds {
		var res uint64
		for a := s.Addr + b.lo; a < s.Addr+b.hi; a = (a + pageSize) &^ (pageSize - 1) {
			if r.isResident(a) {
				res += min((a+pageSize)&^(pageSize-1), s.Addr+b.hi) - a
			}
		}
		out = append(out, table{b.name, b.hi - b.lo, res})
	}
	return out
}

// print writes the report, .text's top modules by their resident bytes.
func (r *report) print(w io.Writer, top int) {
	fmt.Fprintf(w, "%s\n", r.exe)
	var total uint64
	for _, m := range r.mappings {
		res := 0
		for _, p := range m.resident {
			if p {
				res++
			}
		}
		total += uint64(res) * pageSize
		fmt.Fprintf(w, "mapping %s %6.1f MiB: %6.1f MiB resident; 64 KiB windows: %d with a resident page, %d of them all resident\n",
			m.perm, float64(m.end-m.start)/mib, float64(res)*pageSize/mib, m.touched, m.full)
	}
	fmt.Fprintf(w, "resident: %.1f MiB", float64(total)/mib)
	if r.large >= 0 {
		fmt.Fprintf(w, ", of which in large folios: %.1f MiB", float64(r.large)*pageSize/mib)
	}
	fmt.Fprintln(w)
	names := make([]string, 0, len(r.sections))
	for n := range r.sections {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(r.sections[b], r.sections[a]) })
	for _, n := range names {
		if r.sections[n] < pageSize {
			continue // a page's worth of a small section
		}
		fmt.Fprintf(w, "section %-12s %6.2f MiB resident\n", n, float64(r.sections[n])/mib)
	}
	for _, t := range r.pcln {
		fmt.Fprintf(w, ".gopclntab %-12s %6.2f MiB, %6.2f MiB resident\n", t.name, float64(t.size)/mib, float64(t.resident)/mib)
	}
	mods := make([]string, 0, len(r.modules))
	for m := range r.modules {
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b string) int { return cmp.Compare(r.modules[b], r.modules[a]) })
	var rest float64
	for i, m := range mods {
		if i >= top {
			rest += r.modules[m]
			continue
		}
		fmt.Fprintf(w, ".text %-50s %6.2f MiB\n", m, r.modules[m]/mib)
	}
	if rest > 0 {
		fmt.Fprintf(w, ".text %-50s %6.2f MiB\n", "(the other modules)", rest/mib)
	}
}
