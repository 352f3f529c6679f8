package config

// ProvidersInUse splits the providers into those some model uses and
// those none does, each sorted by name. Only the providers in use are
// built, so only their environment variables are needed.
func (c *Config) ProvidersInUse() (used, unused []string) {
	inUse := map[string]bool{}
	for _, m := range c.Models {
		inUse[m.Provider] = true
	}
	for _, name := range sortedKeys(c.Providers) {
		if inUse[name] {
			used = append(used, name)
		} else {
			unused = append(unused, name)
		}
	}
	return used, unused
}

// CheckEnv reports, all at once as an [*Errors], every environment
// variable that a provider in use names but that lookup finds unset or
// empty. Each problem names the variable and the provider's key, never a
// value.
func (c *Config) CheckEnv(lookup func(name string) (string, bool)) error {
	v := &checker{c: c}
	used, _ := c.ProvidersInUse()
	for _, name := range used {
		s := c.Providers[name].Settings
		if s == nil {
			continue
		}
		vars := s.EnvVars()
		for _, key := range sortedKeys(vars) {
			switch val, ok := lookup(vars[key]); {
			case !ok:
				v.at("providers."+name+"."+key, "the environment variable %s is not set", vars[key])
			case val == "":
				v.at("providers."+name+"."+key, "the environment variable %s is empty", vars[key])
			}
		}
	}
	return newErrors(c.file, v.out)
}
